import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A cache file that cannot be read or written (reason `cache`), or a short disk (`no-space`).
struct CacheError: Error {
    let message: String
    var code: String = Reason.cache
}

/// Files on disk: atomic writes (temp + fsync + rename + directory fsync).
enum Files {
    static func atomicWrite(_ data: Data, to url: URL) throws(CacheError) {
        let dir = url.deletingLastPathComponent()
        do {
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        } catch {
            throw CacheError(message: "cannot create \(dir.path): \(error.localizedDescription)")
        }
        let temp = dir.appendingPathComponent(".\(url.lastPathComponent).\(UUID().uuidString).tmp")
        let fd = open(temp.path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        guard fd >= 0 else { throw CacheError(message: "cannot write \(temp.path): \(String(cString: strerror(errno)))") }
        var ok = true
        var err: Int32 = 0
        data.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = write(fd, raw.baseAddress! + offset, raw.count - offset)
                if n <= 0 {
                    if errno == EINTR { continue }
                    ok = false
                    err = errno
                    return
                }
                offset += n
            }
        }
        if ok, fsync(fd) != 0 {
            ok = false
            err = errno
        }
        close(fd)
        guard ok else {
            unlink(temp.path)
            throw CacheError(message: "cannot write \(url.path): \(String(cString: strerror(err)))",
                             code: err == ENOSPC ? Reason.noSpace : Reason.cache)
        }
        guard rename(temp.path, url.path) == 0 else {
            let e = errno
            unlink(temp.path)
            throw CacheError(message: "cannot rename onto \(url.path): \(String(cString: strerror(e)))")
        }
        fsyncDirectory(dir)
    }

    static func fsyncDirectory(_ dir: URL) {
        let fd = open(dir.path, O_RDONLY)
        if fd >= 0 {
            fsync(fd)
            close(fd)
        }
    }

    /// The file's bytes, nil when it does not exist; a read error is a CacheError.
    static func read(_ url: URL) throws(CacheError) -> Data? {
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        do {
            return try Data(contentsOf: url)
        } catch {
            throw CacheError(message: "cannot read \(url.path): \(error.localizedDescription)")
        }
    }

    /// A JSON object file, nil when absent; unreadable or not an object is a CacheError naming it.
    static func readJSON(_ url: URL) throws(CacheError) -> JSONObject? {
        guard let data = try read(url) else { return nil }
        guard let value = try? StrictJSON.parse(data), let object = value.objectValue else {
            throw CacheError(message: "\(url.path) is corrupt (not a JSON object); remove it to start over")
        }
        return object
    }

    static func writeJSON(_ object: JSONObject, to url: URL) throws(CacheError) {
        try atomicWrite(CanonicalJSON.encode(.object(object)), to: url)
    }

    static func size(_ url: URL) -> Int64? {
        var st = stat()
        guard stat(url.path, &st) == 0 else { return nil }
        return Int64(st.st_size)
    }

    static func remove(_ url: URL) { unlink(url.path) }

    static func freeBytes(_ url: URL) -> Int64? {
        var st = statvfs()
        guard statvfs(url.path, &st) == 0 else { return nil }
        return Int64(st.f_bavail) * Int64(st.f_frsize)
    }
}

/// The cache directory's layout (docs/protocol.md §8).
struct CacheLayout: Sendable {
    let root: URL

    var blobs: URL { root.appendingPathComponent("blobs") }
    func blob(_ sha256: String) -> URL { blobs.appendingPathComponent(sha256) }
    func part(_ sha256: String) -> URL { blobs.appendingPathComponent(sha256 + ".part") }
    func stateDir(_ unit: String) -> URL { root.appendingPathComponent("state").appendingPathComponent(unit) }
    func sequenceFile(_ unit: String) -> URL { stateDir(unit).appendingPathComponent("sequence.json") }
    func tierFile(_ unit: String, _ tier: String) -> URL { stateDir(unit).appendingPathComponent("\(tier).json") }
    func statusFile(_ unit: String) -> URL { stateDir(unit).appendingPathComponent("_status.json") }
    func badFile(_ unit: String) -> URL { stateDir(unit).appendingPathComponent("_bad.json") }
    var installedFile: URL { root.appendingPathComponent("installed.json") }
    var healthFile: URL { root.appendingPathComponent("health.json") }
    var selfTestFile: URL { root.appendingPathComponent("selftest.json") }

    func hasBlob(_ ref: BlobRef) -> Bool { Files.size(blob(ref.sha256)) == ref.size }
}

/// One installed set: a model (one member) or a bundle (every member), switched as one.
struct InstalledSet: Sendable, Equatable {
    struct Member: Sendable, Equatable {
        var entry: ModelEntry
        var backend: String?
    }

    var version: String
    var tier: String
    var isCandidate: Bool
    var sequence: Int64
    var bundled: Bool
    var token: String?
    var reportURL: String?
    var members: [String: Member]
    var previous: [InstalledSet]  // zero or one: the last good set
    /// The app metrics the release declares: what `record` and `observe` take.
    var metrics: [String: AppMetric]?

    var blobs: [BlobRef] { members.values.flatMap(\.entry.blobs) }

    func sameRelease(_ other: InstalledSet) -> Bool {
        version == other.version && Set(members.keys) == Set(other.members.keys)
            && members.allSatisfy { other.members[$0.key]?.entry.sha256 == $0.value.entry.sha256 }
    }

    var json: JSONValue {
        var o = JSONObject()
        o["version"] = .string(version)
        o["tier"] = .string(tier)
        o["is_candidate"] = .bool(isCandidate)
        o["sequence"] = .int(sequence)
        o["bundled"] = .bool(bundled)
        o["token"] = token.map { .string($0) } ?? .null
        o["report_url"] = reportURL.map { .string($0) } ?? .null
        var m = JSONObject()
        for (name, member) in members {
            m[name] = .object(JSONObject([("entry", member.entry.json), ("backend", member.backend.map { .string($0) } ?? .null)]))
        }
        o["members"] = .object(m)
        o["previous"] = previous.first?.json ?? .null
        if let metrics { o["metrics"] = AppMetric.json(metrics) }
        return .object(o)
    }

    init(version: String, tier: String, isCandidate: Bool, sequence: Int64, bundled: Bool, token: String?,
         reportURL: String?, members: [String: Member], previous: [InstalledSet] = [], metrics: [String: AppMetric]? = nil) {
        self.metrics = metrics
        self.version = version
        self.tier = tier
        self.isCandidate = isCandidate
        self.sequence = sequence
        self.bundled = bundled
        self.token = token
        self.reportURL = reportURL
        self.members = members
        self.previous = previous
    }

    init?(json: JSONValue) {
        guard let o = json.objectValue, let version = o["version"]?.stringValue, let tier = o["tier"]?.stringValue,
            let seq = o["sequence"]?.intValue, let m = o["members"]?.objectValue
        else { return nil }
        var members: [String: Member] = [:]
        for name in m.keys {
            guard let e = m[name]?["entry"], let entry = try? ModelEntry(e, name) else { return nil }
            members[name] = Member(entry: entry, backend: m[name]?["backend"]?.stringValue)
        }
        var previous: [InstalledSet] = []
        if let p = o["previous"], !p.isNull {
            guard let set = InstalledSet(json: p) else { return nil }
            previous = [set]
        }
        self.init(version: version, tier: tier, isCandidate: o["is_candidate"]?.boolValue ?? false, sequence: seq,
                  bundled: o["bundled"]?.boolValue ?? false, token: o["token"]?.stringValue,
                  reportURL: o["report_url"]?.stringValue, members: members, previous: previous,
                  metrics: AppMetric.stored(o["metrics"]))
    }
}
