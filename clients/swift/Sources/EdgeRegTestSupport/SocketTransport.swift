import EdgeReg
import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

#if os(Linux)
private let streamSocket = Int32(SOCK_STREAM.rawValue)
private let noSignal = Int32(MSG_NOSIGNAL)
#else
private let streamSocket = SOCK_STREAM
private let noSignal: Int32 = 0
#endif

/// A failure of the socket transport.
struct SocketError: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
}

/// Plain HTTP/1.1 over a socket bound to a given local address, as a `ClientTransport`: for
/// tests and fleet simulations, where each simulated device leaves from its own loopback
/// address (URLSession cannot bind one). Not in the library product.
public final class SocketTransport: ClientTransport, @unchecked Sendable {
    let source: String
    let deadline: Double

    /// `deadline`: seconds an exchange may take in all.
    public init(source: String, deadline: Double = 600) {
        self.source = source
        self.deadline = deadline
    }

    /// One exchange on its own connection, closed when the exchange ends.
    final class Exchange: @unchecked Sendable {
        let fd: Int32
        var buffer: [UInt8] = []
        var status = 0
        var headers: [String: String] = [:]
        var remaining: Int64?  // Content-Length left, nil: until close (or chunked)
        var chunked = false
        var chunkLeft: Int64 = 0
        var finished = false
        let deadline: Date

        init(fd: Int32, deadline: Date) {
            self.fd = fd
            self.deadline = deadline
        }

        deinit { close(fd) }

        func fill() throws -> Bool {
            guard Date() < deadline else { throw SocketError(message: "the fetch went past its deadline") }
            var chunk = [UInt8](repeating: 0, count: 64 * 1024)
            let n = recv(fd, &chunk, chunk.count, 0)
            if n < 0 { throw SocketError(message: "read failed: \(String(cString: strerror(errno)))") }
            if n == 0 { return false }
            buffer.append(contentsOf: chunk[0..<n])
            return true
        }

        func line() throws -> String {
            while true {
                if let i = buffer.firstIndex(of: 0x0A) {
                    let text = String(decoding: buffer[..<i], as: UTF8.self).trimmingCharacters(in: CharacterSet(charactersIn: "\r"))
                    buffer.removeFirst(i + 1)
                    return text
                }
                guard try fill() else { throw SocketError(message: "connection closed in the headers") }
            }
        }

        func readHead() throws {
            let statusLine = try line()
            let parts = statusLine.split(separator: " ")
            guard parts.count >= 2, parts[0].hasPrefix("HTTP/"), let code = Int(parts[1]) else {
                throw SocketError(message: "not an HTTP answer")
            }
            status = code
            while true {
                let header = try line()
                if header.isEmpty { break }
                guard let colon = header.firstIndex(of: ":") else { continue }
                headers[header[..<colon].lowercased()] = header[header.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            }
            chunked = headers["transfer-encoding"]?.lowercased().contains("chunked") == true
            remaining = chunked ? nil : headers["content-length"].flatMap { Int64($0) }
            if status == 304 || status == 204 || (100..<200).contains(status) { remaining = 0 }
        }

        /// The next piece of the body, nil at its end.
        func next() throws -> Data? {
            if finished { return nil }
            if chunked {
                if chunkLeft == 0 {
                    var size = try line()
                    if size.isEmpty { size = try line() }  // the CRLF after the previous chunk
                    guard let n = Int64(size.split(separator: ";").first.map(String.init) ?? "", radix: 16) else {
                        throw SocketError(message: "bad chunk size")
                    }
                    if n == 0 {
                        finished = true
                        return nil
                    }
                    chunkLeft = n
                }
                if buffer.isEmpty { guard try fill() else { throw SocketError(message: "connection closed in a chunk") } }
                let take = Int(min(Int64(buffer.count), chunkLeft))
                let out = Data(buffer[..<take])
                buffer.removeFirst(take)
                chunkLeft -= Int64(take)
                return out
            }
            if let left = remaining, left <= 0 {
                finished = true
                return nil
            }
            if buffer.isEmpty {
                guard try fill() else {
                    finished = true
                    if let left = remaining, left > 0 { throw SocketError(message: "connection closed early") }
                    return nil
                }
            }
            var take = buffer.count
            if let left = remaining { take = Int(min(Int64(take), left)) }
            let out = Data(buffer[..<take])
            buffer.removeFirst(take)
            if remaining != nil { remaining! -= Int64(take) }
            return out
        }
    }

    func open(_ url: URL, method: String, headers: [String: String], body: Data?, timeout: Double) throws -> Exchange {
        guard url.scheme == "http", let host = url.host else {
            throw SocketError(message: "\(url.absoluteString): only plain http with a source address")
        }
        let port = url.port ?? 80
        var hints = addrinfo()
        hints.ai_family = AF_INET
        hints.ai_socktype = streamSocket
        var info: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &info) == 0, let first = info else {
            throw SocketError(message: "\(host): cannot resolve")
        }
        defer { freeaddrinfo(info) }
        let fd = socket(AF_INET, streamSocket, 0)
        guard fd >= 0 else { throw SocketError(message: "no socket") }
        let exchange = Exchange(fd: fd, deadline: Date().addingTimeInterval(deadline))
        var local = sockaddr_in()
        #if !os(Linux)
        local.sin_len = UInt8(MemoryLayout<sockaddr_in>.size)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
        #endif
        local.sin_family = sa_family_t(AF_INET)
        local.sin_addr.s_addr = inet_addr(source)
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else { throw SocketError(message: "cannot bind \(source): \(String(cString: strerror(errno)))") }
        var tv = timeval(tv_sec: Int(timeout), tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        guard connect(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0 else {
            throw SocketError(message: "\(url.absoluteString): cannot connect: \(String(cString: strerror(errno)))")
        }
        var path = URLComponents(url: url, resolvingAgainstBaseURL: true)?.percentEncodedPath ?? url.path
        if path.isEmpty { path = "/" }
        if let query = url.query { path += "?" + query }
        // One exchange per connection, closed here once the body is read: a GET needs no
        // "Connection: close" (nor the server's echo of it, 38 bytes of an unchanged check).
        // The client's headers (User-Agent, Accept-Encoding: identity, ...) come in `headers`.
        var head = "\(method) \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\n"
        if method != "GET" { head += "Connection: close\r\n" }
        for (k, v) in headers { head += "\(k): \(v)\r\n" }
        if let body { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        var out = Data(head.utf8)
        if let body { out.append(body) }
        try out.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = send(fd, raw.baseAddress! + offset, raw.count - offset, noSignal)
                if n <= 0 { throw SocketError(message: "\(url.absoluteString): write failed") }
                offset += n
            }
        }
        try exchange.readHead()
        return exchange
    }

    public func get(_ url: URL, headers: [String: String], timeout: Double) async throws -> TransportResponse {
        let exchange = try open(url, method: "GET", headers: headers, body: nil, timeout: timeout)
        // The blocking reads run on a thread of their own; shutting the socket down (a cancel)
        // ends a blocked read at once. The closures hold the exchange, never its bare fd:
        // once the exchange closed it, the number may be another socket's (a test server's
        // listener, which a late shutdown stopped accepting: "Couldn't connect").
        let body = AsyncThrowingStream<Data, Error> { continuation in
            let reader = Thread {
                do {
                    while let chunk = try exchange.next() { continuation.yield(chunk) }
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            reader.start()
            continuation.onTermination = { _ in shutdown(exchange.fd, Int32(SHUT_RDWR)) }
        }
        return TransportResponse(status: exchange.status, headers: exchange.headers, body: body,
                                 cancel: { shutdown(exchange.fd, Int32(SHUT_RDWR)) })
    }

    public func post(_ url: URL, body: Data, headers: [String: String], timeout: Double) async throws -> Int {
        let exchange = try open(url, method: "POST", headers: headers, body: body, timeout: timeout)
        while try exchange.next() != nil {}
        return exchange.status
    }
}
