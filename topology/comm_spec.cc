#include "topology/comm_spec.h"

namespace shardsim {

const char* ProtocolName(Protocol protocol) {
  switch (protocol) {
    case Protocol::kLL:
      return "LL";
    case Protocol::kLL128:
      return "LL128";
    case Protocol::kSimple:
      return "Simple";
  }
  return "?";
}

}  // namespace shardsim
