"""The JSON Schemas of the report (``--gpu-report``, schema 1) and of a stored baseline,
built from the metric descriptors and shipped as files in ``pytest_gpuprof/schemas/``.

``python -m pytest_gpuprof.output.schema`` writes the files; the suite holds them equal to
what this module builds, validates every report it writes against them, and reads frozen
reports and baselines of this format (``tests/data/``) that every later version must read.
A report may carry fields the schema does not name (``pytest_gpuprof_update_json`` adds
them); the fields it names have the types and ranges given here.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from pytest_gpuprof.analysis import descriptors

# the report format's number (its ``schema`` field): a reader refuses a newer one
SCHEMA = 1
FOLDER = Path(__file__).resolve().parents[1] / "schemas"
FILES = {"report": FOLDER / "report.schema.json", "baseline": FOLDER / "baseline.schema.json"}
_DRAFT = "https://json-schema.org/draft/2020-12/schema"
_NUMBER = {"type": "number"}
_SHARE = {"type": ["number", "null"]}


def _figure(metric: descriptors.Metric) -> dict[str, Any]:
    """A figure of a window or step: null where it was not measured (never 0 for that)."""
    if metric.unit == "flag":
        return {"type": ["boolean", "null"]}
    kind: dict[str, Any] = {"type": ["integer", "null"]} if metric.unit in ("count", "flags") else dict(_SHARE)
    if metric.name != "discrepancy":  # no time, size, count or share of the wall is negative
        kind["minimum"] = 0
    return kind


def _figures(scope: descriptors.Scope, required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "required": list(required),
        "properties": {m.name: _figure(m) for m in descriptors.of_scope(scope)},
    }


def _breach() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["metric", "value", "limit", "kind", "key"],
        "properties": {
            "metric": {"type": "string"},
            "value": _NUMBER,
            "limit": {"type": ["number", "string"]},
            "kind": {"enum": ["min", "max", "forbid", "missing"]},
            "key": {"type": "string"},
            "window": {"type": ["integer", "null"], "minimum": 0},
        },
    }


def _memory() -> dict[str, Any]:
    """A window's device memory: a figure known as a range only reads null, and ``bounds``
    gives its least and most, by the figure's path."""
    memory = _figures("memory", ("source",))
    pair = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2}
    memory["properties"] |= {"source": {"type": "string"}, "bounds": {"type": "object", "additionalProperties": pair}}
    return memory


def _test() -> dict[str, Any]:
    """A test's entry: a measured one, or one whose xdist worker died (``crashed``)."""
    breaches = {"type": "array", "items": {"$ref": "#/$defs/breach"}}
    metrics = _figures("window", ("wall_ms", "truth"))
    metrics["properties"] |= {
        "wall_ms": {"type": "number", "minimum": 0},
        "truth": {"type": "string"},
        "steps": {"type": "object", "additionalProperties": _figures("step")},
        "notes": {"type": "array", "items": {"type": "string"}},
        "memory": _memory(),
    }
    summary = {
        "type": "object",
        "required": ["samples"],
        "properties": {"samples": {"type": "array", "items": _NUMBER, "minItems": 1}, "median": _SHARE},
    }
    return {
        "type": "object",
        "required": ["nodeid", "outcome"],
        "properties": {
            "nodeid": {"type": "string", "minLength": 1},
            "outcome": {"type": "string"},
            "crashed": {"type": "string"},
            "reruns": {"type": "integer", "minimum": 0},
            "metrics": metrics,
            "rounds": {"type": "object", "additionalProperties": summary},
            "budget": {
                "type": "object",
                "required": ["limits", "breaches"],
                "properties": {"limits": {"type": "object"}, "breaches": breaches},
            },
            "windows": {"type": "integer", "minimum": 1},
            "examples": {"type": "integer", "minimum": 1},
            "verdict": {"type": "string"},
            "judgement": {
                "type": "object",
                "required": ["status"],
                "properties": {"status": {"type": "string"}, "breaches": breaches, "expected": breaches},
            },
            "device": {"type": "integer", "minimum": 0},
            "waited_ms": {"type": "number", "minimum": 0},
            "checks": {"type": "array", "items": {"type": "object", "required": ["breaches", "expected"]}},
            "comparisons": {"type": "array", "items": {"type": "object"}},
            **_compared(),
            "xfail": {"type": "boolean"},
        },
        "if": {"required": ["crashed"]},
        "else": {"required": ["metrics", "rounds", "budget", "windows", "verdict", "judgement"]},
    }


def _compared() -> dict[str, Any]:
    """A test entry's comparison with its baseline."""
    return {
        # which baseline record the test was compared with
        "baseline": {
            "type": "object",
            "required": ["key", "name", "created", "commit", "branch", "pooled", "status"],
            "properties": {
                "key": {"type": "string"},
                "name": {"type": "string"},
                "created": {"type": "string"},
                "commit": {"type": "string"},
                "branch": {"type": "string"},
                "pooled": {"type": "integer", "minimum": 1},
                "status": {"enum": ["compared", "new", "not compared"]},
                "why_not": {"type": "string"},
            },
        },
        # what the gate decided of the test, and the figures it left undecided
        "gate": {
            "type": "object",
            "required": ["decision", "undecided"],
            "properties": {
                "decision": {"enum": ["regression", "undecided", "improvement", "unchanged", "new"]},
                "undecided": {"type": "array", "items": _UNDECIDED},
                # the fresh runs its regressions were put to (--gpu-compare-confirm)
                "confirmed_by": {"type": "integer", "minimum": 1},
                # a regression: why its wall time changed against the baseline's entry
                "explain": _EXPLAIN,
            },
        },
    }


_EXPLAIN = {
    "type": "object",
    "required": ["nodeid", "before_ms", "after_ms", "causes", "unexplained_ms"],
    "properties": {
        "nodeid": {"type": "string"},
        "before_ms": {"type": "number"},
        "after_ms": {"type": "number"},
        "causes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["what", "ms", "share", "evidence"],
                "properties": {
                    "what": {"type": "string"},
                    "ms": {"type": "number"},
                    "share": {"type": ["number", "null"]},
                    "evidence": {"type": "string"},
                },
            },
        },
        "unexplained_ms": {"type": "number"},
        # the device memory it held, before -> after, and the places that kept it
        "memory": {"type": "object", "required": ["peak_before", "peak_after", "kept_before", "kept_after", "places"]},
        # the causes one of the two records holds no facts for
        "unjudged": {"type": "array", "items": {"type": "string"}},
    },
}
_UNDECIDED = {
    "type": "object",
    "required": ["metric", "why", "decide", "moved"],
    "properties": {
        "metric": {"type": "string"},
        "why": {"type": "string"},
        "decide": {"type": "string"},
        "moved": {"type": ["number", "null"]},  # the median's move toward worse, in thresholds
    },
}
_NODEIDS = {"type": "array", "items": {"type": "string"}}
# the run's gate: which baseline, and the gated tests by decision
_RUN_GATE = {
    "type": "object",
    "required": ["baseline", "regressions", "undecided", "improvements", "unchanged"],
    "properties": {
        "baseline": {
            "type": ["object", "null"],
            "required": ["key", "name", "commit", "branch", "created", "runs"],
            "properties": {"runs": {"type": "integer", "minimum": 1}},
        },
        "regressions": _NODEIDS,
        "undecided": _NODEIDS,
        "improvements": _NODEIDS,
        "unchanged": {"type": "integer", "minimum": 0},
        "new": _NODEIDS,
    },
}


def report_schema() -> dict[str, Any]:
    return {
        "$schema": _DRAFT,
        "$id": "pytest-gpuprof/report.schema.json",
        "title": f"pytest-gpuprof JSON report, schema {SCHEMA}",
        "type": "object",
        "required": ["schema", "created", "machine", "tests"],
        "properties": {
            "schema": {"const": SCHEMA},
            "created": {"type": "string", "format": "date-time"},
            "commit": {"type": "string"},
            "branch": {"type": "string"},
            "machine": {
                "type": "object",
                "required": ["id", "gpu", "driver", "pcie", "backend", "truth"],
                "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "backend": {"enum": ["cuda", "host"]},
                    "clock": {"enum": ["real", "virtual"]},
                    # what besides the code changes kernel times: library versions, power limit, GPU
                    "environment": {"type": "object", "additionalProperties": {"type": "string"}},
                    "devices": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                },
            },
            "tests": {"type": "array", "items": {"$ref": "#/$defs/test"}},
            "partial": {"type": "string"},
            "part": {"type": "string"},
            "note": {"type": "string"},
            "gate": _RUN_GATE,
            # every test the run ran, measured or not, by its outcome
            "outcomes": {
                "type": "object",
                "additionalProperties": {"enum": ["passed", "failed", "skipped", "xfailed", "xpassed"]},
            },
        },
        "$defs": {"test": _test(), "breach": _breach()},
    }


def baseline_schema() -> dict[str, Any]:
    """A stored baseline: a report, with the name it was saved under and its run's id."""
    return {
        "$schema": _DRAFT,
        "$id": "pytest-gpuprof/baseline.schema.json",
        "title": f"pytest-gpuprof stored baseline (a report, schema {SCHEMA}, named)",
        "allOf": [{"$ref": "report.schema.json"}],
        "required": ["name", "run_id"],
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z0-9_.\\-]{1,64}$"},
            "run_id": {"type": "string", "minLength": 1},
        },
    }


BUILT = {"report": report_schema, "baseline": baseline_schema}


def text(which: str) -> str:
    return json.dumps(BUILT[which](), indent=2, sort_keys=True) + "\n"


def validate(document: dict[str, Any], which: str = "report") -> None:
    """Raise ``jsonschema.ValidationError`` where ``document`` breaks its schema (needs the
    ``jsonschema`` library, which the suite installs; the plugin never imports it itself)."""
    _validator(which).validate(document)


@functools.cache
def _validator(which: str) -> Any:
    """The shipped file's validator, built once a process (the suite checks hundreds of
    reports: building it is most of a small report's check)."""
    import jsonschema
    from referencing import Registry, Resource

    schemas = {name: json.loads(path.read_text()) for name, path in FILES.items()}
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas.values())
    return jsonschema.Draft202012Validator(schemas[which], registry=registry, format_checker=jsonschema.FormatChecker())


if __name__ == "__main__":
    FOLDER.mkdir(exist_ok=True)
    for name, path in FILES.items():
        path.write_text(text(name))
        print(f"wrote {path}")
