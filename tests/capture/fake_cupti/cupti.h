#include "cupti_activity.h"
