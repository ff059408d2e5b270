#include "kiln/core/error.h"

namespace kiln::detail {

void throw_error(ErrorKind kind, const std::string& msg) {
  switch (kind) {
    case ErrorKind::Value:
      throw ValueError(msg);
    case ErrorKind::Type:
      throw TypeError(msg);
    case ErrorKind::Index:
      throw IndexError(msg);
    case ErrorKind::Device:
      throw DeviceError(msg);
    case ErrorKind::NotImplemented:
      throw NotImplementedError(msg);
    case ErrorKind::Internal:
      throw InternalError(msg);
  }
  throw Error(msg);
}

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(fmt::format("[internal] bug in Kiln: assertion `{}` failed at {}:{}{}{}",
                                  cond, file, line, msg.empty() ? "" : ": ", msg));
}

}  // namespace kiln::detail
