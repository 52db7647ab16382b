/* status.c - status names and messages, and the runtime version query. */
#include "rmsnorm.h"

unsigned rmsnorm_version_number(void) { return RMSNORM_VERSION_NUMBER; }
const char *rmsnorm_version_string(void) { return RMSNORM_VERSION_STRING; }

const char *rmsnorm_status_name(rmsnorm_status status) {
  switch (status) {
    case RMSNORM_OK: return "RMSNORM_OK";
    case RMSNORM_ERROR_NULL_POINTER: return "RMSNORM_ERROR_NULL_POINTER";
    case RMSNORM_ERROR_BAD_SIZE: return "RMSNORM_ERROR_BAD_SIZE";
    case RMSNORM_ERROR_BAD_STRIDE: return "RMSNORM_ERROR_BAD_STRIDE";
    case RMSNORM_ERROR_BAD_EPS: return "RMSNORM_ERROR_BAD_EPS";
    case RMSNORM_ERROR_BAD_PARTIAL: return "RMSNORM_ERROR_BAD_PARTIAL";
    case RMSNORM_ERROR_BAD_DTYPE: return "RMSNORM_ERROR_BAD_DTYPE";
    case RMSNORM_ERROR_BAD_FLAGS: return "RMSNORM_ERROR_BAD_FLAGS";
    case RMSNORM_ERROR_OVERLAP: return "RMSNORM_ERROR_OVERLAP";
    case RMSNORM_ERROR_OUT_OF_MEMORY: return "RMSNORM_ERROR_OUT_OF_MEMORY";
    case RMSNORM_ERROR_BAD_ARGUMENT: return "RMSNORM_ERROR_BAD_ARGUMENT";
    case RMSNORM_ERROR_NOT_AVAILABLE: return "RMSNORM_ERROR_NOT_AVAILABLE";
    case RMSNORM_ERROR_BAD_CONFIG: return "RMSNORM_ERROR_BAD_CONFIG";
    case RMSNORM_ERROR_OUT_OF_RANGE: return "RMSNORM_ERROR_OUT_OF_RANGE";
    case RMSNORM_ERROR_BAD_ROPE: return "RMSNORM_ERROR_BAD_ROPE";
  }
  return "unknown status";
}

const char *rmsnorm_status_message(rmsnorm_status status) {
  switch (status) {
    case RMSNORM_OK: return "success";
    case RMSNORM_ERROR_NULL_POINTER: return "a required pointer is NULL";
    case RMSNORM_ERROR_BAD_SIZE: return "d is 0 or the tensor extent is too large";
    case RMSNORM_ERROR_BAD_STRIDE: return "a row stride is smaller than d";
    case RMSNORM_ERROR_BAD_EPS: return "eps must be finite and >= 0";
    case RMSNORM_ERROR_BAD_PARTIAL:
      return "partial fraction must be in (0, 1] (and 1 for LayerNorm)";
    case RMSNORM_ERROR_BAD_DTYPE:
      return "unknown dtype, or a parameter dtype that is neither fp32 nor the data dtype";
    case RMSNORM_ERROR_BAD_FLAGS: return "unknown flag, or a flag this operation does not take";
    case RMSNORM_ERROR_OVERLAP:
      return "an output overlaps another buffer without being an exact in-place view";
    case RMSNORM_ERROR_OUT_OF_MEMORY: return "out of memory";
    case RMSNORM_ERROR_BAD_ARGUMENT:
      return "invalid argument (for example dweight requested without a weight)";
    case RMSNORM_ERROR_NOT_AVAILABLE: return "not available in this build or on this CPU";
    case RMSNORM_ERROR_BAD_CONFIG:
      return "the config was not filled by rmsnorm_config_init, or sets fields this library "
             "version does not know";
    case RMSNORM_ERROR_OUT_OF_RANGE:
      return "a position or cache slot outside its table or cache";
    case RMSNORM_ERROR_BAD_ROPE:
      return "invalid rotation: unknown style or norm mode, rotary_dim odd or above head_dim, "
             "theta <= 1 or linear factor <= 0";
  }
  return "unknown status";
}
