// A minimal HTTP/1.0 request over a loopback socket for tests (status code and body), with a
// deadline on connect, send and receive.
#ifndef HYREC_TESTS_HTTP_GET_H_
#define HYREC_TESTS_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace hyrec {

struct HttpResponse {
  int status = 0;  // 0: no answer
  std::string body;
};

// `headers`: extra header lines, each ending in \r\n.
// `content_length`: whether the request says "Content-Length: 0" (`curl -X POST` without data
// sends none).
inline HttpResponse HttpRequest(int port, const std::string& method, const std::string& path,
                                const std::string& headers = "", bool content_length = true) {
  HttpResponse response;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return response;
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return response;
  }
  const std::string request = method + " " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n" +
                              (content_length ? "Content-Length: 0\r\n" : "") + headers + "\r\n";
  if (send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return response;
  }
  std::string raw;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) raw.append(buffer, n);
  close(fd);
  if (raw.rfind("HTTP/1.", 0) != 0 || raw.size() < 12) return response;
  response.status = std::atoi(raw.c_str() + 9);
  const size_t body = raw.find("\r\n\r\n");
  if (body != std::string::npos) response.body = raw.substr(body + 4);
  return response;
}

inline HttpResponse HttpGet(int port, const std::string& path) { return HttpRequest(port, "GET", path); }

}  // namespace hyrec

#endif  // HYREC_TESTS_HTTP_GET_H_
