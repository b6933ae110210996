import Foundation

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A network failure worth retrying later (reason `transport`), or a 404 (`not-found`).
struct TransportError: Error {
    let message: String
    var status: Int? = nil
}

/// Limits of docs/protocol.md §7: headers within `timeout`, the whole fetch within
/// `deadline`, and a body no slower than `minRate` bytes/s over each `timeout` window.
public struct Limits: Sendable, Equatable {
    public var timeout: Double
    public var deadline: Double
    public var minRate: Double

    public init(timeout: Double = 30, deadline: Double = 600, minRate: Double = 1024) {
        self.timeout = timeout
        self.deadline = deadline
        self.minRate = minRate
    }
}

/// One HTTP response whose body is read chunk by chunk.
final class StreamedResponse: @unchecked Sendable {
    let status: Int
    let headers: [String: String]
    let url: String
    private var iterator: AsyncThrowingStream<Data, Error>.Iterator?
    private let read: (@Sendable () throws -> Data?)?
    private let cancel: @Sendable () -> Void
    private let limits: Limits
    private var windowStart = Date()
    private var windowBytes = 0

    init(status: Int, headers: [String: String], url: String, iterator: AsyncThrowingStream<Data, Error>.Iterator,
         limits: Limits, cancel: @escaping @Sendable () -> Void) {
        self.status = status
        self.headers = headers
        self.url = url
        self.iterator = iterator
        self.read = nil
        self.limits = limits
        self.cancel = cancel
    }

    /// A response read by a blocking function (the socket transport).
    init(status: Int, headers: [String: String], url: String, limits: Limits,
         read: @escaping @Sendable () throws -> Data?, cancel: @escaping @Sendable () -> Void) {
        self.status = status
        self.headers = headers
        self.url = url
        self.iterator = nil
        self.read = read
        self.limits = limits
        self.cancel = cancel
    }

    func header(_ name: String) -> String? { headers[name.lowercased()] }

    var contentLength: Int64? {
        header("content-length").flatMap { Int64($0.trimmingCharacters(in: .whitespaces)) }
    }

    /// The first byte of a 206 answer (`Content-Range: bytes <n>-…`).
    var rangeStart: Int64? {
        guard let value = header("content-range"), value.hasPrefix("bytes ") else { return nil }
        return Int64(value.dropFirst(6).prefix { $0 != "-" })
    }

    /// The next chunk, or nil at the end of the body.
    func next() async throws -> Data? {
        let next: Data?
        if let read {
            next = try read()
        } else {
            next = try await iterator?.next()
        }
        guard let chunk = next else { return nil }
        windowBytes += chunk.count
        let elapsed = Date().timeIntervalSince(windowStart)
        if elapsed >= limits.timeout {
            // A server that trickles a byte a second never trips a read timeout.
            if Double(windowBytes) < limits.minRate * elapsed {
                close()
                throw TransportError(message: "\(url): body slower than \(Int(limits.minRate)) bytes/s")
            }
            windowStart = Date()
            windowBytes = 0
        }
        return chunk
    }

    func close() { cancel() }
}

/// What the client needs of HTTP: a streamed GET, a GET into a sink, a small POST.
protocol Transport: Sendable {
    func get(_ url: URL, headers: [String: String]) async throws -> StreamedResponse
    func fetch(_ url: URL, headers: [String: String], into sink: any BodySink) async throws
    func post(_ url: URL, body: Data, contentType: String, timeout: Double) async throws -> Int
}

// MARK: - the public seam

/// How the client speaks HTTP, for an app with its own stack or a test (as
/// swift-openapi-runtime's `ClientTransport`): `ClientConfiguration(transport:)`. The default
/// is URLSession. The client adds the protocol's headers (User-Agent, If-None-Match, Range,
/// Accept-Encoding: identity) and keeps every rule: size and digest checks, the deadline and
/// minimum rate, cancellation through `TransportResponse.cancel`. A transport must not
/// transform the body (no content decoding).
public protocol ClientTransport: Sendable {
    /// One GET; any status is returned, not thrown. Throw for a request that did not complete.
    func get(_ url: URL, headers: [String: String], timeout: Double) async throws -> TransportResponse
    /// POST a small body (a report); the status code.
    func post(_ url: URL, body: Data, headers: [String: String], timeout: Double) async throws -> Int
}

/// One response of a `ClientTransport`: status, headers (lower-case names), the body as it
/// arrives, and how to cut the connection (a cancel, or the client stopping a refused body).
public struct TransportResponse: Sendable {
    public let status: Int
    public let headers: [String: String]
    public let body: AsyncThrowingStream<Data, Error>
    public let cancel: @Sendable () -> Void

    public init(status: Int, headers: [String: String], body: AsyncThrowingStream<Data, Error>, cancel: @escaping @Sendable () -> Void) {
        self.status = status
        self.headers = headers
        self.body = body
        self.cancel = cancel
    }
}

/// An app's `ClientTransport` behind the client's internal `Transport`.
final class AppTransport: Transport, @unchecked Sendable {
    let wrapped: any ClientTransport
    let limits: Limits

    init(_ wrapped: any ClientTransport, limits: Limits) {
        self.wrapped = wrapped
        self.limits = limits
    }

    private func withProtocolHeaders(_ headers: [String: String]) -> [String: String] {
        var all = ["User-Agent": SDK.userAgent, "Accept-Encoding": "identity"]
        for (k, v) in headers { all[k] = v }
        return all
    }

    private func open(_ url: URL, _ headers: [String: String]) async throws -> TransportResponse {
        do {
            return try await wrapped.get(url, headers: withProtocolHeaders(headers), timeout: limits.timeout)
        } catch let e as TransportError {
            throw e
        } catch {
            throw TransportError(message: "\(url.absoluteString): \(error)")
        }
    }

    func get(_ url: URL, headers: [String: String]) async throws -> StreamedResponse {
        let r = try await open(url, headers)
        return StreamedResponse(status: r.status, headers: r.headers, url: url.absoluteString, iterator: r.body.makeAsyncIterator(),
                                limits: limits, cancel: r.cancel)
    }

    func fetch(_ url: URL, headers: [String: String], into sink: any BodySink) async throws {
        let r = try await open(url, headers)
        defer { sink.end() }
        guard sink.begin(status: r.status, headers: r.headers) else {
            r.cancel()
            return
        }
        do {
            try await withTaskCancellationHandler {
                for try await chunk in r.body {
                    if Task.isCancelled || !sink.receive(chunk) {
                        r.cancel()
                        return
                    }
                }
            } onCancel: {
                r.cancel()
            }
        } catch {
            if sink.stopped { return }
            throw TransportError(message: "\(url.absoluteString): \(error)")
        }
    }

    func post(_ url: URL, body: Data, contentType: String, timeout: Double) async throws -> Int {
        do {
            return try await wrapped.post(url, body: body, headers: withProtocolHeaders(["Content-Type": contentType]), timeout: timeout)
        } catch {
            throw TransportError(message: "\(url.absoluteString): \(error)")
        }
    }
}

/// The SDK's version, as the device program and the User-Agent give it.
enum SDK {
    static let version = "0.3.0"
    /// Sent on every request, on both transports.
    static let userAgent = "edgereg-swift/\(version)"

    /// The headers every request carries besides its own: a short User-Agent (libcurl's
    /// default names the process and curl's version) and an explicit Accept. On Linux,
    /// FoundationNetworking also adds `Accept-Language` from the locale and
    /// `Connection: keep-alive` (HTTP/1.1's default anyway); a blank value is libcurl's way
    /// to drop a header (CURLOPT_HTTPHEADER: "no content on the right side of the colon"),
    /// which takes 45 bytes off an unchanged check. Apple's URLSession sends its own few.
    static let headers: [String: String] = {
        var fields = ["User-Agent": userAgent, "Accept": "*/*"]
        #if canImport(FoundationNetworking)
        fields["Accept-Language"] = " "
        fields["Connection"] = " "
        #endif
        return fields
    }()
}

/// HTTP GET and POST over URLSession (FoundationNetworking on Linux).
final class HTTPTransport: NSObject, URLSessionDataDelegate, Transport, @unchecked Sendable {
    private let lock = NSLock()
    private var session: URLSession!
    private var streams: [Int: (response: CheckedContinuation<URLResponse, Error>?, body: AsyncThrowingStream<Data, Error>.Continuation)] = [:]
    private var tasks: [Int: URLSessionDataTask] = [:]
    private var sinks: [Int: (sink: any BodySink, done: CheckedContinuation<Void, Error>)] = [:]
    let limits: Limits

    init(limits: Limits) {
        self.limits = limits
        super.init()
        let config = URLSessionConfiguration.ephemeral
        // No cache layer at all (the client revalidates with its own ETag and checks every
        // manifest's signature and sequence): nothing can answer for the registry.
        config.requestCachePolicy = .reloadIgnoringLocalCacheData
        config.urlCache = nil
        config.timeoutIntervalForRequest = limits.timeout
        config.timeoutIntervalForResource = limits.deadline
        config.httpMaximumConnectionsPerHost = 2
        session = URLSession(configuration: config, delegate: self, delegateQueue: nil)
    }

    deinit { session.invalidateAndCancel() }

    func get(_ url: URL, headers: [String: String]) async throws -> StreamedResponse {
        var request = URLRequest(url: url)
        request.httpMethod = "GET"
        request.timeoutInterval = limits.timeout
        for (k, v) in SDK.headers { request.setValue(v, forHTTPHeaderField: k) }
        // Our own conditional and range requests: nothing may transform the bytes (libcurl
        // and Apple's URLSession would otherwise ask for gzip and decode it themselves).
        request.setValue("identity", forHTTPHeaderField: "Accept-Encoding")
        for (k, v) in headers { request.setValue(v, forHTTPHeaderField: k) }
        let task = session.dataTask(with: request)
        let (stream, body) = AsyncThrowingStream<Data, Error>.makeStream()
        let response: URLResponse
        do {
            response = try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<URLResponse, Error>) in
                    lock.withLock { streams[task.taskIdentifier] = (continuation, body) }
                    task.resume()
                }
            } onCancel: {
                task.cancel()
            }
        } catch {
            throw TransportError(message: "\(url.absoluteString): \(error.localizedDescription)")
        }
        guard let http = response as? HTTPURLResponse else {
            task.cancel()
            throw TransportError(message: "\(url.absoluteString): not an HTTP response")
        }
        var fields: [String: String] = [:]
        for (k, v) in http.allHeaderFields {
            if let k = k as? String, let v = v as? String { fields[k.lowercased()] = v }
        }
        let id = task.taskIdentifier
        lock.withLock { tasks[id] = task }
        return StreamedResponse(status: http.statusCode, headers: fields, url: url.absoluteString,
                                iterator: stream.makeAsyncIterator(), limits: limits,
                                cancel: { [weak self] in self?.cancelTask(id) })
    }

    private func cancelTask(_ id: Int) {
        let task = lock.withLock { tasks.removeValue(forKey: id) }
        task?.cancel()
    }

    /// GET with the body handed to `sink` on the delegate's queue as it arrives: nothing
    /// piles up in memory, and the sink stops the transfer the moment it refuses a byte.
    func fetch(_ url: URL, headers: [String: String], into sink: any BodySink) async throws {
        var request = URLRequest(url: url)
        request.httpMethod = "GET"
        request.timeoutInterval = limits.timeout
        for (k, v) in SDK.headers { request.setValue(v, forHTTPHeaderField: k) }
        request.setValue("identity", forHTTPHeaderField: "Accept-Encoding")
        for (k, v) in headers { request.setValue(v, forHTTPHeaderField: k) }
        let task = session.dataTask(with: request)
        do {
            // A cancelled Swift task cancels the transfer at once, also a stalled one.
            try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, Error>) in
                    lock.withLock { sinks[task.taskIdentifier] = (sink, done) }
                    task.resume()
                }
            } onCancel: {
                task.cancel()
            }
        } catch {
            throw TransportError(message: "\(url.absoluteString): \(error.localizedDescription)")
        }
    }

    /// POST a small body; the status code, or a TransportError.
    func post(_ url: URL, body: Data, contentType: String, timeout: Double) async throws -> Int {
        var request = URLRequest(url: url)
        request.httpMethod = "POST"
        request.httpBody = body
        request.timeoutInterval = timeout
        for (k, v) in SDK.headers { request.setValue(v, forHTTPHeaderField: k) }
        request.setValue(contentType, forHTTPHeaderField: "Content-Type")
        let response = try await get(request: request)
        return response
    }

    private func get(request: URLRequest) async throws -> Int {
        let task = session.dataTask(with: request)
        let (stream, body) = AsyncThrowingStream<Data, Error>.makeStream()
        let response: URLResponse
        do {
            response = try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<URLResponse, Error>) in
                lock.withLock { streams[task.taskIdentifier] = (continuation, body) }
                task.resume()
            }
        } catch {
            throw TransportError(message: "\(request.url?.absoluteString ?? ""): \(error.localizedDescription)")
        }
        for try await _ in stream {}
        return (response as? HTTPURLResponse)?.statusCode ?? 0
    }

    // MARK: URLSessionDataDelegate

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                    completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void) {
        if let sink = lock.withLock({ sinks[dataTask.taskIdentifier]?.sink }) {
            var fields: [String: String] = [:]
            let http = response as? HTTPURLResponse
            for (k, v) in http?.allHeaderFields ?? [:] {
                if let k = k as? String, let v = v as? String { fields[k.lowercased()] = v }
            }
            completionHandler(sink.begin(status: http?.statusCode ?? 0, headers: fields) ? .allow : .cancel)
            return
        }
        let continuation = lock.withLock { () -> CheckedContinuation<URLResponse, Error>? in
            let c = streams[dataTask.taskIdentifier]?.response
            streams[dataTask.taskIdentifier]?.response = nil
            return c
        }
        continuation?.resume(returning: response)
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        if let sink = lock.withLock({ sinks[dataTask.taskIdentifier]?.sink }) {
            if !sink.receive(data) { dataTask.cancel() }
            return
        }
        let body = lock.withLock { streams[dataTask.taskIdentifier]?.body }
        body?.yield(data)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: Error?) {
        if let entry = lock.withLock({ sinks.removeValue(forKey: task.taskIdentifier) }) {
            entry.sink.end()
            // A transfer the sink stopped is not a network error: the sink says what happened.
            if let error, !entry.sink.stopped {
                entry.done.resume(throwing: error)
            } else {
                entry.done.resume()
            }
            return
        }
        let entry = lock.withLock { () -> (response: CheckedContinuation<URLResponse, Error>?, body: AsyncThrowingStream<Data, Error>.Continuation)? in
            tasks[task.taskIdentifier] = nil
            return streams.removeValue(forKey: task.taskIdentifier)
        }
        guard let entry else { return }
        if let error {
            entry.response?.resume(throwing: error)
            entry.body.finish(throwing: TransportError(message: error.localizedDescription))
        } else {
            if let response = task.response {
                entry.response?.resume(returning: response)
            } else {
                entry.response?.resume(throwing: TransportError(message: "no response"))
            }
            entry.body.finish()
        }
    }

    /// Redirects are followed to http and https only (a CDN may redirect; the bytes are
    /// checked anyway). Any other scheme (`file:`, `ftp:`, `data:`) is not followed: the
    /// redirect itself becomes the answer, which the client reports as a transport failure
    /// naming it, never as what a local file or another protocol happened to say.
    func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                    newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void) {
        completionHandler(Self.followable(response, request) ? request : nil)
    }

    /// Whether a redirect goes to http(s). The `Location` itself is read: FoundationNetworking
    /// on Linux resolves `file:///etc/passwd` against the registry's URL and would ask the
    /// registry for `/etc/passwd` (its 404 then read as "no manifest").
    static func followable(_ response: HTTPURLResponse, _ request: URLRequest) -> Bool {
        let isWeb = { (scheme: String?) in scheme?.lowercased() == "http" || scheme?.lowercased() == "https" }
        guard isWeb(request.url?.scheme) else { return false }
        let location = response.allHeaderFields.first { ($0.key as? String)?.lowercased() == "location" }?.value as? String
        guard let location else { return true }
        let trimmed = location.trimmingCharacters(in: .whitespaces)
        // A scheme is letters, digits, "+", "-" and "." before the first ":" (RFC 3986 §3.1),
        // and comes before any "/", "?" or "#": otherwise the Location is relative.
        guard let colon = trimmed.firstIndex(of: ":"),
              trimmed[..<colon].allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "+-.".contains($0)) }),
              !trimmed[..<colon].isEmpty
        else { return true }
        return isWeb(String(trimmed[..<colon]))
    }
}

/// Receives a response body on the transport's queue, chunk by chunk.
protocol BodySink: AnyObject, Sendable {
    /// The status and headers (lowercased names); false stops the transfer.
    func begin(status: Int, headers: [String: String]) -> Bool
    /// The next bytes; false stops the transfer.
    func receive(_ data: Data) -> Bool
    /// The transfer ended (completed, failed or stopped).
    func end()
    /// The sink stopped the transfer itself.
    var stopped: Bool { get }
}
