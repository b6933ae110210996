import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Streams one blob into its `.part` file as the bytes arrive, checking rules 13–14 on the
/// way (docs/protocol.md §7–§8): nothing past the declared size is read or written, the
/// digest is computed while downloading, and a refusal deletes the `.part`.
///
/// FoundationNetworking hands the body over in libcurl's pieces of at most 16 KiB
/// (CURL_MAX_WRITE_SIZE); the verified bytes are gathered and written 256 KiB at a time,
/// a sixteenth of the write calls. Whatever is gathered is written when the transfer ends
/// or stops for a resume, so the `.part` always holds every byte that was checked.
final class BlobWriter: BodySink, @unchecked Sendable {
    static let writeSize = 256 * 1024
    private let lock = NSLock()
    private let part: URL
    private let have: Int64
    private let url: String
    private var check: BlobCheck
    private var fd: Int32 = -1
    private var pending: [UInt8] = []
    private var failure: Failure?
    private var _transferred: Int64 = 0
    private var _restart = false
    private var _stopped = false
    private var _announced = false
    private let limits: Limits
    private var windowStart = Date()
    private var windowBytes = 0

    private let deadline: Date
    /// Told the count of each run of new bytes written (the update's progress).
    private let onBytes: (@Sendable (Int64) -> Void)?

    init(part: URL, check: BlobCheck, have: Int64, url: String, limits: Limits, deadline: Date,
         onBytes: (@Sendable (Int64) -> Void)? = nil) {
        self.onBytes = onBytes
        self.limits = limits
        self.deadline = deadline
        self.part = part
        self.check = check
        self.have = have
        self.url = url
    }

    var restart: Bool { lock.withLock { _restart } }
    var stopped: Bool { lock.withLock { _stopped } }
    var transferred: Int64 { lock.withLock { _transferred } }
    /// The answer carried a Content-Length (held to what remains): a body ending short of it
    /// is a cut connection; without one, the end of the body is the end of the answer.
    var announced: Bool { lock.withLock { _announced } }
    var outcome: (BlobCheck, Failure?, Int64) { lock.withLock { (check, failure, _transferred) } }

    private func stop(_ f: Failure?, deletePart: Bool) -> Bool {
        failure = f
        _stopped = true
        if deletePart {
            pending.removeAll()
        } else if fd >= 0, let err = flush() {
            // Kept for a resume, but the disk refused the rest: nothing worth keeping.
            failure = writeFailure(err)
            pending.removeAll()
            close(fd)
            fd = -1
            Files.remove(part)
            return false
        }
        if fd >= 0 {
            close(fd)
            fd = -1
        }
        if deletePart { Files.remove(part) }
        return false
    }

    /// Write what was gathered; the errno of a failed write, nil when all of it is on disk.
    private func flush() -> Int32? {
        defer { pending.removeAll(keepingCapacity: true) }
        let err = pending.withUnsafeBytes { raw -> Int32 in
            var offset = 0
            while offset < raw.count {
                let n = write(fd, raw.baseAddress! + offset, raw.count - offset)
                if n <= 0 {
                    if n < 0, errno == EINTR { continue }
                    return n < 0 ? errno : EIO
                }
                offset += n
            }
            return 0
        }
        return err == 0 ? nil : err
    }

    private func writeFailure(_ err: Int32) -> Failure {
        Failure(code: err == ENOSPC ? Reason.noSpace : Reason.cache,
                message: "cannot write \(part.path): \(String(cString: strerror(err)))")
    }

    func begin(status: Int, headers: [String: String]) -> Bool {
        let ok = beginLocked(status: status, headers: headers)
        // The server ignored the Range: the bytes kept are to be fetched again.
        if ok, have > 0, status == 200 { onBytes?(-have) }
        return ok
    }

    private func beginLocked(status: Int, headers: [String: String]) -> Bool {
        lock.withLock {
            let rangeStart = headers["content-range"].flatMap { value -> Int64? in
                guard value.hasPrefix("bytes ") else { return nil }
                return Int64(value.dropFirst(6).prefix { $0 != "-" })
            }
            var truncate = false
            if have > 0, !(status == 206 && rangeStart == have) {
                if status == 200 {
                    // The server ignored the Range (a plain static server): take the whole body.
                    truncate = true
                    check.reset()
                } else {
                    _restart = true
                    return stop(nil, deletePart: false)
                }
            }
            guard status == 200 || (status == 206 && rangeStart == check.received) else {
                return stop(Failure(code: Reason.transport, message: "\(url) answered HTTP \(status), expected 200"), deletePart: false)
            }
            do {
                let length = headers["content-length"].flatMap { Int64($0.trimmingCharacters(in: .whitespaces)) }
                try check.expect(length)
                _announced = length != nil
            } catch {
                return stop((error as? Rejection)?.failure ?? Failure(code: Reason.badBlob, message: "\(error)"), deletePart: true)
            }
            fd = open(part.path, O_WRONLY | O_CREAT | (truncate ? O_TRUNC : O_APPEND), 0o644)
            pending.reserveCapacity(BlobWriter.writeSize + 64 * 1024)
            guard fd >= 0 else {
                return stop(Failure(code: Reason.cache, message: "cannot write \(part.path): \(String(cString: strerror(errno)))"), deletePart: false)
            }
            return true
        }
    }

    func receive(_ data: Data) -> Bool {
        let accepted = receiveLocked(data)
        if accepted { onBytes?(Int64(data.count)) }
        return accepted
    }

    private func receiveLocked(_ data: Data) -> Bool {
        lock.withLock {
            guard fd >= 0 else { return false }
            do {
                // One byte past the declared size is a failure; it is never written.
                try check.update(data)
            } catch {
                return stop((error as? Rejection)?.failure ?? Failure(code: Reason.badBlob, message: "\(error)"), deletePart: true)
            }
            pending.append(contentsOf: data)
            if pending.count >= BlobWriter.writeSize, let err = flush() {
                // Free the space: the app needs it more than a resume.
                return stop(writeFailure(err), deletePart: true)
            }
            _transferred += Int64(data.count)
            // A body slower than the minimum rate over a whole window gives up; the part stays
            // for a resume (a server trickling a byte a second never trips a read timeout).
            if Date() > deadline {
                return stop(Failure(code: Reason.transport, message: "\(url): the update went past its deadline of \(Int(limits.deadline)) s; the next update resumes"), deletePart: false)
            }
            windowBytes += data.count
            let elapsed = Date().timeIntervalSince(windowStart)
            if elapsed >= limits.timeout {
                if Double(windowBytes) < limits.minRate * elapsed {
                    return stop(Failure(code: Reason.transport, message: "\(url): body slower than \(Int(limits.minRate)) bytes/s; the next update resumes"), deletePart: false)
                }
                windowStart = Date()
                windowBytes = 0
            }
            return true
        }
    }

    func end() {
        lock.withLock {
            if fd >= 0, let err = flush() {
                failure = writeFailure(err)
                close(fd)
                fd = -1
                Files.remove(part)
                return
            }
            if fd >= 0 {
                if fsync(fd) != 0, failure == nil {
                    failure = Failure(code: Reason.cache, message: "cannot sync \(part.path)")
                }
                close(fd)
                fd = -1
            }
        }
    }
}
