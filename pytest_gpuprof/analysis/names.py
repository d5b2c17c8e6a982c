"""Kernel names as a person reads them.

``readable``: a C++ symbol demangled by ``cpp-demangle`` (a maintained demangler that
reads the long CUTLASS/cuDNN templates libstdc++'s gives up on), else by the C++ runtime's
own ``__cxa_demangle``, else kept as it came. Names that are not C++ symbols
(``fft``, ``sm90_xmma_gemm_...``, Triton's ``triton_poi_fused_add_0``) stay as they are.

``short``: what a line or a label shows, at most ``SHORT`` characters: the function's base
name, and where the function is a generic wrapper (``Kernel``, ``device_kernel``,
``vectorized_elementwise_kernel``, anything named ``*kernel``) its first template argument
that is not a number, itself reduced to a base name (a lambda to the function it is in).
``short_names`` makes them unique within one table.

The mangled name stays the identity in reports, gates and history; all of this is display.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

SHORT = 80
ELLIPSIS = "\u2026"


@functools.lru_cache(maxsize=1)
def _cxa_demangler() -> Any:
    path = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        library = ctypes.CDLL(path)
    except OSError:
        return None
    demangle = library.__cxa_demangle
    demangle.restype = ctypes.c_void_p
    demangle.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_int),
    ]
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    return demangle, free


def _cxa(name: str) -> str | None:
    found = _cxa_demangler()
    if found is None:
        return None
    demangle, free = found
    status = ctypes.c_int(0)
    out = demangle(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return None
    try:
        return ctypes.string_at(out).decode(errors="replace")
    finally:
        free(out)


@functools.lru_cache(maxsize=1)
def _library_demangler() -> Any:
    try:
        import cpp_demangle
    except ImportError:
        return None
    return cpp_demangle.demangle


@functools.lru_cache(maxsize=4096)
def readable(name: str) -> str:
    """``name`` demangled where it is a C++ symbol, else as it is."""
    if not name.startswith("_Z"):
        return name
    demangle = _library_demangler()
    if demangle is not None:
        try:
            return str(demangle(name))
        except ValueError:  # not a symbol it can read
            pass
    return _cxa(name) or name


_OPEN, _CLOSE = "<({[", ">)}]"
_OPERATOR = re.compile(r"operator\s*(\(\)|\[\]|->\*?|<<=?|>>=?|<=>|[<>!=+\-*/%^&|~]=?|&&|\|\||\+\+|--|,|new|delete)")
_NUMBER = re.compile(r"^(\(\w[\w ]*\))?-?\d+[ul]*$|^(true|false)$")
_ANONYMOUS = "(anonymous namespace)"


def _scan(text: str) -> list[tuple[int, str]]:
    """Each character of ``text`` at nesting depth 0 with its index; operator names
    (``operator()``, ``operator<``) and ``(anonymous namespace)`` count as plain text."""
    out: list[tuple[int, str]] = []
    depth, i = 0, 0
    while i < len(text):
        if depth == 0 and text.startswith(_ANONYMOUS, i):
            out += [(i + k, c) for k, c in enumerate(_ANONYMOUS)]
            i += len(_ANONYMOUS)
            continue
        if text.startswith("operator", i) and (match := _OPERATOR.match(text, i)):
            if depth == 0:
                out += [(i + k, c) for k, c in enumerate(match.group())]
            i = match.end()
            continue
        c = text[i]
        if c in _OPEN:
            if depth == 0:
                out.append((i, c))
            depth += 1
        elif c in _CLOSE:
            depth = max(depth - 1, 0)
            if depth == 0:
                out.append((i, c))
        elif depth == 0:
            out.append((i, c))
        i += 1
    return out


def _split(text: str, separator: str) -> list[str]:
    """``text`` cut at ``separator`` where it stands at nesting depth 0."""
    cuts, top = [0], _scan(text)
    positions = {i for i, _ in top}
    at = 0
    while (found := text.find(separator, at)) >= 0:
        if all(found + k in positions for k in range(len(separator))):
            cuts += [found, found + len(separator)]
        at = found + len(separator)
    cuts.append(len(text))
    return [text[cuts[k] : cuts[k + 1]].strip() for k in range(0, len(cuts), 2)]


def _qualified(name: str) -> str:
    """The qualified name of a demangled function: without its return type and parameters."""
    for i, c in _scan(name):
        if c == "(" and not name.startswith(_ANONYMOUS, i):
            name = name[:i]
            break
    words = _split(name, " ")
    return words[-1] if words else name


def _components(name: str) -> list[str]:
    return [part for part in _split(name, "::") if part]


def _base(component: str) -> tuple[str, str | None]:
    """A name component's base name and the text of its template arguments."""
    for i, c in _scan(component):
        if c == "<":
            close = component.rfind(">")
            return component[:i], component[i + 1 : close] if close > i else None
        if c == "(" and not component.startswith(_ANONYMOUS, i):
            return component[:i], None
    return component, None


def _named(name: str) -> tuple[str, str | None]:
    """The base name a person would call ``name`` by: its last component that is not a
    lambda or a call operator (a lambda is called by the function it is in)."""
    parts = _components(_qualified(name))
    for part in reversed(parts):
        base, arguments = _base(part)
        if base and not base.startswith(("{", "operator", _ANONYMOUS)):
            return base, arguments
    return (_base(parts[-1])[0] if parts else name), None


_WRAPPER = re.compile(r"(?i)kernel\d*$")  # Kernel, Kernel2, device_kernel, elementwise_kernel


def _wrapper(base: str) -> bool:
    return _WRAPPER.search(base) is not None


def fit(text: str, limit: int = SHORT) -> str:
    """``text`` cut to ``limit`` characters, an ellipsis last where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


@functools.lru_cache(maxsize=4096)
def short(name: str, every_argument: bool = False) -> str:
    """The name a line shows (``name`` as ``readable`` gives it), at most ``SHORT``
    characters. ``every_argument``: each template argument's base name, not only the
    first, for telling two instances of one template apart."""
    if "(" not in name and "<" not in name:
        return fit(name)
    base, arguments = _named(name)
    if arguments is not None and (_wrapper(base) or every_argument):
        named = [_named(a)[0] for a in _split(arguments, ",") if a and (every_argument or not _NUMBER.match(a))]
        if named:
            return fit(f"{base}<{', '.join(named if every_argument else named[:1])}>")
    return fit(base or name)


def short_names(names: Iterable[str]) -> dict[str, str]:
    """Each distinct mangled (or plain) name's short name, no two alike: where two share
    one, each shows its template arguments; where they still do, the later ones (in the
    order of their mangled names) a number."""
    distinct = sorted(set(names))
    first = {n: short(readable(n)) for n in distinct}
    sharing = Counter(first.values())
    out: dict[str, str] = {}
    used: set[str] = set()
    for n in distinct:
        name = first[n] if sharing[first[n]] == 1 else short(readable(n), every_argument=True)
        base, k = name, 1
        while name in used:
            k += 1
            name = fit(base, SHORT - len(f" #{k}")) + f" #{k}"
        used.add(name)
        out[n] = name
    return out


def clean(text: str) -> str:
    """``text`` another user or program wrote (a report, a store's record, a lock's
    who-file), as a terminal may print it: control characters (an escape sequence that
    would move the cursor, clear the screen or retitle the window) and lone surrogates
    shown escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
