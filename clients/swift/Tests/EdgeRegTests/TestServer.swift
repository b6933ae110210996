import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

@testable import EdgeReg

#if os(Linux)
private let streamSocket = Int32(SOCK_STREAM.rawValue)
private let noSignal = Int32(MSG_NOSIGNAL)
#else
private let streamSocket = SOCK_STREAM
private let noSignal: Int32 = 0
#endif

/// A static HTTP/1.1 server on 127.0.0.1 for the client tests, the way nginx serves a
/// registry: ETag and If-None-Match (304), Range (206, 416), and knobs to misbehave
/// (drop a body part way, serve other bytes, ignore ranges). Real sockets, no mocks.
final class TestServer: @unchecked Sendable {
    let root: URL
    private let lock = NSLock()
    private var listener: Int32 = -1
    private(set) var port: UInt16 = 0
    private var _dropAfter: [String: Int] = [:]
    private var _overrides: [String: Data] = [:]
    private var _ranges = true
    private var _log: [(path: String, status: Int, bytes: Int)] = []
    private var _requests: [(path: String, headers: [String: String])] = []
    private var _reports: [Data] = []
    private var _failPosts = 0
    private var _postAnswers: [Int] = []
    private var _offline = false
    private var _postDelay: useconds_t = 0
    private var _getDelay: [String: useconds_t] = [:]
    private var _trickle: Set<String> = []
    private var _omitLength: Set<String> = []
    private var _redirects: [String: String] = [:]

    var url: URL { URL(string: "http://127.0.0.1:\(port)/")! }

    init(root: URL) throws {
        self.root = root
        listener = socket(AF_INET, streamSocket, 0)
        var yes: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = 0
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(listener, 16) == 0 else { throw CocoaError(.fileWriteUnknown) }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &len) }
        }
        port = UInt16(bigEndian: addr.sin_port)
        let thread = Thread { [self] in acceptLoop() }
        thread.start()
    }

    func stop() {
        lock.withLock {
            shutdown(listener, Int32(SHUT_RDWR))
            close(listener)
            listener = -1
        }
    }

    func dropAfter(_ path: String, _ bytes: Int) { lock.withLock { _dropAfter[path] = bytes } }
    func override(_ path: String, _ data: Data?) { lock.withLock { _overrides[path] = data } }
    func setRanges(_ on: Bool) { lock.withLock { _ranges = on } }
    /// Serve `path` at about 2 KB/s (a server that never trips a read timeout).
    func trickle(_ path: String) { lock.withLock { _ = _trickle.insert(path) } }
    /// Answer `path` without a Content-Length: the body ends where the connection closes.
    func omitLength(_ path: String) { lock.withLock { _ = _omitLength.insert(path) } }
    /// Answer `path` with a 302 to `location` (any URL, other schemes included).
    func redirect(_ path: String, to location: String) { lock.withLock { _redirects[path] = location } }
    /// The next `n` reports are answered 503 (the store is down).
    func failPosts(_ n: Int) { lock.withLock { _failPosts = n } }
    /// How the next reports are answered, one status each (then 202); 0: no answer at all.
    func answerPosts(_ statuses: [Int]) { lock.withLock { _postAnswers.append(contentsOf: statuses) } }
    /// While set, no report gets an answer: the connection closes unanswered (the device is offline).
    func setOffline(_ on: Bool) { lock.withLock { _offline = on } }
    /// Hold each report this long before answering (a slow collector).
    func delayPosts(_ microseconds: useconds_t) { lock.withLock { _postDelay = microseconds } }
    /// Hold each answer to a GET of `path` this long before its headers (a slow registry).
    func delayGets(_ path: String, _ microseconds: useconds_t) { lock.withLock { _getDelay[path] = microseconds } }
    /// Tries to post a report, answered or not.
    var postCount: Int { lock.withLock { _requests.filter { $0.path.hasSuffix("reports") }.count } }
    var log: [(path: String, status: Int, bytes: Int)] { lock.withLock { _log } }
    var reports: [Data] { lock.withLock { _reports } }
    func resetLog() { lock.withLock { _log = [] } }
    /// Every request's path and headers (names lowercased), in arrival order.
    var requests: [(path: String, headers: [String: String])] { lock.withLock { _requests } }
    func bodyBytes(_ prefix: String) -> Int { log.filter { $0.path.hasPrefix(prefix) }.reduce(0) { $0 + $1.bytes } }

    private func acceptLoop() {
        while true {
            let fd = lock.withLock { listener }
            guard fd >= 0 else { return }
            let client = accept(fd, nil, nil)
            if client < 0 { return }
            Thread { [self] in handle(client) }.start()
        }
    }

    private func readRequest(_ fd: Int32) -> (method: String, path: String, headers: [String: String], body: Data)? {
        var buffer = Data()
        var chunk = [UInt8](repeating: 0, count: 4096)
        while buffer.range(of: Data("\r\n\r\n".utf8)) == nil {
            let n = recv(fd, &chunk, chunk.count, 0)
            if n <= 0 { return nil }
            buffer.append(contentsOf: chunk[0..<n])
        }
        let end = buffer.range(of: Data("\r\n\r\n".utf8))!
        let head = String(decoding: buffer[..<end.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
        let first = head[0].split(separator: " ")
        guard first.count >= 2 else { return nil }
        var headers: [String: String] = [:]
        for line in head.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        var body = Data(buffer[end.upperBound...])
        let length = Int(headers["content-length"] ?? "0") ?? 0
        while body.count < length {
            let n = recv(fd, &chunk, chunk.count, 0)
            if n <= 0 { break }
            body.append(contentsOf: chunk[0..<n])
        }
        return (String(first[0]), String(first[1].dropFirst()), headers, body)
    }

    private func sendAll(_ fd: Int32, _ data: Data) {
        data.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = send(fd, raw.baseAddress! + offset, raw.count - offset, noSignal)
                if n <= 0 { return }
                offset += n
            }
        }
    }

    private func respond(_ fd: Int32, _ status: Int, _ headers: [String: String], _ body: Data, path: String, limit: Int? = nil) {
        var text = "HTTP/1.1 \(status) X\r\nConnection: close\r\n"
        var h = headers
        if !lock.withLock({ _omitLength.contains(path) }) { h["Content-Length"] = String(body.count) }
        for (k, v) in h { text += "\(k): \(v)\r\n" }
        text += "\r\n"
        let sent = limit.map { min($0, body.count) } ?? body.count
        // Logged before the bytes go out, so a test that saw the answer also sees the entry.
        lock.withLock { _log.append((path, status, sent)) }
        sendAll(fd, Data(text.utf8))
        if lock.withLock({ _trickle.contains(path) }) {
            var offset = 0
            while offset < sent {
                let end = min(sent, offset + 100)
                sendAll(fd, body.subdata(in: offset..<end))
                offset = end
                usleep(50_000)
                if lock.withLock({ listener < 0 }) { return }
            }
            return
        }
        sendAll(fd, body.prefix(sent))
    }

    private func handle(_ fd: Int32) {
        defer { close(fd) }
        guard let request = readRequest(fd) else { return }
        lock.withLock { _requests.append((request.path, request.headers)) }
        if request.method == "POST" {
            let (answer, delay) = lock.withLock { () -> (Int?, useconds_t) in
                if _offline { return (0, _postDelay) }
                if _failPosts > 0 {
                    _failPosts -= 1
                    return (503, _postDelay)
                }
                return (_postAnswers.isEmpty ? nil : _postAnswers.removeFirst(), _postDelay)
            }
            if delay > 0 { usleep(delay) }
            if answer == 0 { return }  // closed with no answer
            if let answer {
                respond(fd, answer, ["Retry-After": "1"], Data(), path: request.path)
                return
            }
            lock.withLock { _reports.append(request.body) }
            respond(fd, 202, ["Content-Type": "application/json"], Data("{\"status\":\"accepted\"}".utf8), path: request.path)
            return
        }
        if let delay = lock.withLock({ _getDelay[request.path] }), delay > 0 { usleep(delay) }
        if let location = lock.withLock({ _redirects[request.path] }) {
            respond(fd, 302, ["Location": location], Data(), path: request.path)
            return
        }
        let (override, ranges) = lock.withLock { (_overrides[request.path], _ranges) }
        guard let data = override ?? FileManager.default.contents(atPath: root.appendingPathComponent(request.path).path) else {
            respond(fd, 404, [:], Data(), path: request.path)
            return
        }
        let etag = "\"\(SHA256Hasher.hex(data).prefix(16))\""
        if request.headers["if-none-match"] == etag {
            respond(fd, 304, ["ETag": etag], Data(), path: request.path)
            return
        }
        let drop = lock.withLock { () -> Int? in
            let d = _dropAfter[request.path]
            _dropAfter[request.path] = nil  // one-shot
            return d
        }
        if ranges, let range = request.headers["range"], range.hasPrefix("bytes="), range.hasSuffix("-"),
            let start = Int(range.dropFirst(6).dropLast())
        {
            guard start < data.count else {
                respond(fd, 416, ["Content-Range": "bytes */\(data.count)"], Data(), path: request.path)
                return
            }
            respond(fd, 206, ["ETag": etag, "Content-Range": "bytes \(start)-\(data.count - 1)/\(data.count)"],
                    data.subdata(in: start..<data.count), path: request.path, limit: drop)
            return
        }
        respond(fd, 200, ["ETag": etag], data, path: request.path, limit: drop)
    }
}

/// A registry written by the tests: blobs by digest and manifests signed with the
/// committed test-only key (tests/vectors/keys), as the Python publisher writes them.
final class TestRegistry: @unchecked Sendable {
    let root: URL
    let seed: Data
    let publicPEM: String
    var sequence: Int64 = 0

    init(root: URL) throws {
        self.root = root
        let pem = try String(contentsOf: vectorsDir.appendingPathComponent("keys/test-only-registry.private.pem"), encoding: .utf8)
        seed = Ed25519.seed(pkcs8PEM: pem)!
        let raw = Ed25519.sign(Data(), seed: seed)!.publicKey
        let der = Data([0x30, 0x2A, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x03, 0x21, 0x00]) + raw
        publicPEM = "-----BEGIN PUBLIC KEY-----\n\(der.base64EncodedString())\n-----END PUBLIC KEY-----\n"
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
    }

    var trusted: TrustedKeys { TrustedKeys(pems: [publicPEM])! }

    @discardableResult
    func blob(_ data: Data) throws -> BlobRef {
        let sha = SHA256Hasher.hex(data)
        let url = root.appendingPathComponent("blobs/sha256/\(sha)")
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try data.write(to: url)
        return BlobRef(sha256: sha, size: Int64(data.count))
    }

    /// Deterministic bytes per name and version.
    static func bytes(_ seed: String, _ size: Int) -> Data {
        var out = Data()
        var block = Data(seed.utf8)
        while out.count < size {
            block = SHA256Hasher.digest(block)
            out.append(block)
        }
        return out.prefix(size)
    }

    func entry(_ name: String, _ version: String, size: Int = 40_000, backends: [String] = ["opencl", "cpu"],
               runtime: String = "3.6.1", probe: JSONValue? = nil, labels: [String]? = nil, contract: JSONValue? = nil) throws -> JSONValue {
        let ref = try blob(Self.bytes("\(name)-\(version)", size))
        var o = JSONObject()
        o["version"] = .string(version)
        o["variant"] = .string("int8")
        o["path"] = .string(ref.path)
        o["sha256"] = .string(ref.sha256)
        o["size"] = .int(ref.size)
        o["min_mnn_runtime"] = .string(runtime)
        o["runtime"] = .object(JSONObject([
            ("threads", .int(2)), ("backends", .array(backends.map { .string($0) })), ("precision", .string("normal")),
        ]))
        if let contract { o["contract"] = contract }
        if let labels {
            o["contract"] = .object(JSONObject([
                ("inputs", .array([.object(JSONObject([("name", .string("x")), ("dtype", .string("float32")), ("shape", .array([.int(1), .int(4)]))]))])),
                ("outputs", .array([.object(JSONObject([("name", .string("y")), ("dtype", .string("float32")), ("shape", .array([.int(2)]))]))])),
                ("task", .object(JSONObject([("kind", .string("classification"))]))),
                ("labels", .array(labels.map { .string($0) })),
            ]))
        }
        if let probe {
            var p = probe.objectValue!
            p["artifact_sha256"] = .string(ref.sha256)
            let pref = try blob(CanonicalJSON.encode(.object(p)))
            o["probe"] = .object(JSONObject([("path", .string(pref.path)), ("sha256", .string(pref.sha256)), ("size", .int(pref.size))]))
        }
        return .object(o)
    }

    func bundleEntry(_ version: String, members: [String] = ["cls", "det", "rec"]) throws -> JSONValue {
        .object(JSONObject([
            ("version", .string(version)),
            ("members", .object(JSONObject(try members.map { ($0, try entry($0, version)) }))),
        ]))
    }

    @discardableResult
    func publish(_ unit: String, stable: JSONValue?, candidate: JSONValue? = nil, percent: Double = 50, tier: String = "high",
                 expires: String = "2099-01-01T00:00:00Z", sequence: Int64? = nil, reportURL: String? = nil) throws -> Data {
        self.sequence = sequence ?? self.sequence + 1
        var m = JSONObject()
        m["schema_version"] = .int(1)
        m["model"] = .string(unit)
        m["tier"] = .string(tier)
        m["sequence"] = .int(self.sequence)
        m["expires"] = .string(expires)
        m["stable"] = stable ?? .null
        m["candidate"] = candidate ?? .null
        m["percent"] = candidate == nil ? .null : .double(percent)
        m["salt"] = candidate == nil ? .null : .string("0123456789abcdef")
        m["paused"] = .bool(false)
        if let reportURL { m["report_url"] = .string(reportURL) }
        let payload = CanonicalJSON.encode(.object(m))
        let type = Envelope.manifestType
        let sig = Ed25519.sign(Envelope.pae(type, payload), seed: seed)!
        let keyid = SHA256Hasher.hex(sig.publicKey)
        let envelope = CanonicalJSON.encode(.object(JSONObject([
            ("payload", .string(payload.base64EncodedString())), ("payloadType", .string(type)),
            ("signatures", .array([.object(JSONObject([("keyid", .string(keyid)), ("sig", .string(sig.signature.base64EncodedString()))]))])),
        ])))
        let url = root.appendingPathComponent("manifests/\(unit)/\(tier).json")
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try envelope.write(to: url)
        return envelope
    }
}

/// A device id inside (or outside) the cohort of salt 0123456789abcdef at `percent`.
func deviceID(inside: Bool, percent: Double = 50) -> String {
    var n = 0
    while Cohort.contains(deviceID: "device-\(n)", salt: "0123456789abcdef", percent: percent) != inside { n += 1 }
    return "device-\(n)"
}

func temporaryDirectory() -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("edgereg-swift-\(UUID().uuidString)")
    try? FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}
