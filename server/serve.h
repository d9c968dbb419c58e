// Serve: txl-server once its flags are options (main.cc). Builds the parts
// bottom up from ServerOptions (the model, the state store and recovery, the
// session table, the scheduler, the gRPC and HTTP front ends, metrics),
// serves until SIGTERM or SIGINT arrives in `signals` (blocked by the
// caller), then drains and stops. Returns the process's exit code, having
// printed why on failure.
#ifndef TXL_SERVER_SERVE_H_
#define TXL_SERVER_SERVE_H_

#include <signal.h>

#include "server/server_options.h"

namespace txl {

int Serve(ServerOptions o, sigset_t signals);

}  // namespace txl

#endif  // TXL_SERVER_SERVE_H_
