// The services a server lists through reflection (v1alpha), for tests.
#ifndef TXL_TESTS_SERVER_API_REFLECTION_CLIENT_H_
#define TXL_TESTS_SERVER_API_REFLECTION_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "proto/grpc/reflection/v1alpha/reflection.grpc.pb.h"

namespace txl::testing {

// Empty when the stream fails; `ok` (optional) says whether it finished OK.
inline std::vector<std::string> ListedServices(const std::shared_ptr<grpc::Channel>& channel, bool* ok = nullptr) {
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->ServerReflectionInfo(&ctx);
  grpc::reflection::v1alpha::ServerReflectionRequest req;
  req.set_list_services("");
  std::vector<std::string> names;
  grpc::reflection::v1alpha::ServerReflectionResponse resp;
  if (stream->Write(req) && stream->WritesDone() && stream->Read(&resp)) {
    for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  }
  const grpc::Status status = stream->Finish();
  if (ok != nullptr) *ok = status.ok();
  return names;
}

}  // namespace txl::testing

#endif  // TXL_TESTS_SERVER_API_REFLECTION_CLIENT_H_
