// The web playground served at GET / (index.html beside this file, embedded
// at build time): one page that creates, continues, forks and deletes
// sessions over the HTTP API and streams text token by token.
#ifndef TXL_SERVER_HTTP_PLAYGROUND_PLAYGROUND_PAGE_H_
#define TXL_SERVER_HTTP_PLAYGROUND_PLAYGROUND_PAGE_H_

namespace txl {

const char* PlaygroundPage();

}  // namespace txl

#endif  // TXL_SERVER_HTTP_PLAYGROUND_PLAYGROUND_PAGE_H_
