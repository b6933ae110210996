import EdgeRegTestSupport
import Foundation
import Testing

@testable import EdgeReg

/// A model runner for tests: y = [sum(x), 2·sum(x)] on a good backend; a faulty backend
/// miscomputes (a bad GPU driver), an unavailable one does not exist on this device.
final class FakeRunner: ModelRunner, @unchecked Sendable {
    let faulty: Set<String>
    let unavailable: Set<String>
    private let lock = NSLock()
    private var _loads: [String] = []

    init(faulty: Set<String> = [], unavailable: Set<String> = []) {
        self.faulty = faulty
        self.unavailable = unavailable
    }

    var loads: [String] { lock.withLock { _loads } }

    static func compute(_ x: Tensor) -> Tensor {
        let sum = Float(x.values()!.reduce(0, +))
        var data = Data()
        for v in [sum, 2 * sum] { withUnsafeBytes(of: v.bitPattern.littleEndian) { data.append(contentsOf: $0) } }
        return Tensor(dtype: "float32", shape: [2], data: data)
    }

    struct Session: ModelSession {
        let faulty: Bool
        func run(_ inputs: [String: Tensor]) async throws -> [String: Tensor] {
            var y = FakeRunner.compute(inputs["x"]!)
            if faulty { y = FakeRunner.compute(Tensor(dtype: "float32", shape: [1], data: Data([0, 0, 0x80, 0xBF]))) }
            return ["y": y]
        }
        func close() async {}
    }

    func load(model: URL, backend: String, threads: Int, precision: String, outputs: [String]) async throws -> any ModelSession {
        lock.withLock { _loads.append(backend) }
        if unavailable.contains(backend) { throw BackendUnavailable("no \(backend) here") }
        guard FileManager.default.fileExists(atPath: model.path) else { throw BackendUnavailable("no file") }
        return Session(faulty: faulty.contains(backend))
    }

    /// A golden probe for this runner's good backends.
    static func probe() -> JSONValue {
        var x = Data()
        for v: Float in [0.5, -1, 2, 0.25] { withUnsafeBytes(of: v.bitPattern.littleEndian) { x.append(contentsOf: $0) } }
        let y = compute(Tensor(dtype: "float32", shape: [1, 4], data: x))
        func tensor(_ name: String, _ t: Tensor) -> JSONValue {
            .object(JSONObject([("name", .string(name)), ("dtype", .string(t.dtype)), ("shape", .array(t.shape.map { .int($0) })),
                                ("data", .string(t.data.base64EncodedString()))]))
        }
        return .object(JSONObject([
            ("schema_version", .int(1)), ("model", .string("digits")), ("variant", .string("int8")),
            ("artifact_sha256", .string(String(repeating: "0", count: 64))), ("state", .array([])),
            ("cases", .array([.object(JSONObject([("steps", .array([.object(JSONObject([
                ("inputs", .array([tensor("x", Tensor(dtype: "float32", shape: [1, 4], data: x))])),
                ("expected", .array([tensor("y", y)])),
            ]))]))]))])),
            ("tolerance", .object(JSONObject([("min_cosine", .double(0.99)), ("max_abs_error", .double(0.05))]))),
        ]))
    }
}

/// A stateful model for tests: y = [s + Σh, 2s + Σh] with s = Σx, and h_out = y; it declares
/// its state input h_in as [-1, 2] (a dynamic first axis), as MNN reports a model's inputs.
final class StatefulRunner: ModelRunner, @unchecked Sendable {
    let declares: Bool
    init(declares: Bool) { self.declares = declares }

    static func floats(_ values: [Float], _ shape: [Int]) -> Tensor {
        var data = Data()
        for v in values { withUnsafeBytes(of: v.bitPattern.littleEndian) { data.append(contentsOf: $0) } }
        return Tensor(dtype: "float32", shape: shape, data: data)
    }

    struct Session: ModelSession {
        let inputShapes: [String: [Int]]
        func run(_ inputs: [String: Tensor]) async throws -> [String: Tensor] {
            guard let x = inputs["x"]?.values(), let h = inputs["h_in"]?.values() else { throw BackendUnavailable("no input") }
            let s = Float(x.reduce(0, +)), hs = Float(h.reduce(0, +))
            let y = StatefulRunner.floats([s + hs, 2 * s + hs], [2])
            return ["y": y, "h_out": y]
        }
        func close() async {}
    }

    func load(model: URL, backend: String, threads: Int, precision: String, outputs: [String]) async throws -> any ModelSession {
        Session(inputShapes: declares ? ["x": [1, 4], "h_in": [-1, 2]] : [:])
    }

    /// Two steps from x = [0.5, -1, 2, 0.25] (s = 1.75): y1 = [1.75, 3.5], y2 = [7, 8.75].
    static func probe() -> JSONValue {
        let x = floats([0.5, -1, 2, 0.25], [1, 4])
        func tensor(_ name: String, _ t: Tensor) -> JSONValue {
            .object(JSONObject([("name", .string(name)), ("dtype", .string(t.dtype)), ("shape", .array(t.shape.map { .int($0) })),
                                ("data", .string(t.data.base64EncodedString()))]))
        }
        func step(_ y: [Float]) -> JSONValue {
            .object(JSONObject([("inputs", .array([tensor("x", x)])), ("expected", .array([tensor("y", floats(y, [2]))]))]))
        }
        return .object(JSONObject([
            ("schema_version", .int(1)), ("model", .string("vad")), ("variant", .string("int8")),
            ("artifact_sha256", .string(String(repeating: "0", count: 64))),
            ("state", .array([.array([.string("h_in"), .string("h_out")])])),
            ("cases", .array([.object(JSONObject([("steps", .array([step([1.75, 3.5]), step([7, 8.75])]))]))])),
            ("tolerance", .object(JSONObject([("min_cosine", .double(0.999)), ("max_abs_error", .double(0.001))]))),
        ]))
    }
}

/// One registry served over real HTTP, and clients on a fresh cache directory.
final class Fixture: @unchecked Sendable {
    let dir = temporaryDirectory()
    let registry: TestRegistry
    let server: TestServer
    let cache: URL

    init() throws {
        registry = try TestRegistry(root: dir.appendingPathComponent("registry"))
        server = try TestServer(root: registry.root)
        cache = dir.appendingPathComponent("device")
    }

    func client(_ device: String = deviceID(inside: true), policy: DownloadPolicy = DownloadPolicy(), selfTest: Bool = false,
                runner: (any ModelRunner)? = nil, registryURL: URL? = nil, bundled: [String: BundledRelease] = [:],
                reporting: Bool = false, sourceAddress: String? = nil,
                limits: Limits = Limits(timeout: 10, deadline: 60),
                cpuFeatures: Set<String>? = CPUFeatures.detected, memoryBudgetMB: Double? = nil,
                cacheDirectory: String? = nil) -> EdgeRegClient {
        EdgeRegClient(ClientConfiguration(
            registry: registryURL ?? server.url, trustedKeys: registry.trusted,
            cacheDirectory: cacheDirectory.map { dir.appendingPathComponent($0) } ?? cache,
            device: DeviceFacts(deviceID: device, ramMB: 8192, cpuCores: 6, os: "ios", osVersion: "17.2", mnnRuntime: "3.6.1",
                                appVersion: "2.4.0", cpuFeatures: cpuFeatures, memoryBudgetMB: memoryBudgetMB),
            tier: "high", runner: runner, selfTest: selfTest, policy: policy, limits: limits,
            reporting: reporting, bundled: bundled, transport: sourceAddress.map { SocketTransport(source: $0) }))
    }

    deinit {
        server.stop()
        try? FileManager.default.removeItem(at: dir)
    }
}

let digits = ReleaseUnit.model("digits")

/// The `.part` files under a cache: what a later update would resume.
func parts(_ cache: URL) -> [String] {
    let all = FileManager.default.enumerator(atPath: cache.path)?.allObjects as? [String] ?? []
    return all.filter { $0.hasSuffix(".part") }
}
let ocr = ReleaseUnit.bundle("ocr")

@Suite(.serialized) struct ClientTests {
    /// The unchanged check stays under 400 bytes (issue 17): a short User-Agent and Accept,
    /// Accept-Encoding identity, and on Linux none of FoundationNetworking's extra headers.
    @Test func requestsCarryShortExplicitHeaders() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"))
        let client = f.client()
        #expect(await client.update(digits).ok)
        #expect(await client.update(digits).notModified)
        let gets = f.server.requests
        #expect(gets.count == 3, "\(gets.map(\.path))")
        for (path, headers) in gets {
            #expect(headers["user-agent"] == "edgereg-swift/\(SDK.version)", "\(path)")
            #expect(headers["accept"] == "*/*", "\(path)")
            #expect(headers["accept-encoding"] == "identity", "\(path)")
            #expect(headers["pragma"] == nil && headers["cache-control"] == nil, "\(path)")
            #if canImport(FoundationNetworking)
            #expect(headers["accept-language"] == nil && headers["connection"] == nil, "\(path): \(headers)")
            #endif
        }
        #expect(gets.last?.headers["if-none-match"] != nil, "the check is conditional")
    }

    @Test func installsThenAsksWithIfNoneMatch() async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0", labels: ["zero", "one"])
        try f.registry.publish("digits", stable: v1)
        let client = f.client()
        let first = await client.update(digits)
        #expect(first.ok && first.updated && first.version == "1.0.0", "\(first.error ?? "")")
        #expect(first.downloadedBytes == 40_000)
        #expect(first.labels == ["zero", "one"])
        let path = try #require(first.path)
        #expect(SHA256Hasher.hex(try Data(contentsOf: path)) == v1["sha256"]?.stringValue)
        let again = await client.update(digits)
        #expect(again.ok && again.notModified && !again.updated && again.version == "1.0.0")
        #expect(f.server.log.last?.status == 304)
        let current = await client.current(digits)
        #expect(current.version == "1.0.0" && current.contract?.inputs.first?.spec.name == "x")
        let status = await client.status(digits)
        #expect(status.ready && status.installed?.version == "1.0.0" && status.lastError == nil)
    }

    /// §11, "Runtime hints": the first rule matching this device's cores (6) gives its threads and
    /// backends, the declared precision stays, `runtimeRule` says which; the rule removed with the
    /// sequence advanced reaches the install with no download.
    @Test func theFirstMatchingHintRuleGivesTheRuntimeAndAChangeNeedsNoDownload() async throws {
        let f = try Fixture()
        let plain = try f.registry.entry("digits", "1.0.0")
        func rule(_ match: JSONObject, threads: Int) -> JSONValue {
            .object(JSONObject([
                ("match", .object(match)),
                ("runtime", .object(JSONObject([("threads", .int(threads)), ("backends", .array([.string("cpu")]))]))),
                ("percent", .double(100)), ("salt", .string("0d15ea5e")),
            ]))
        }
        var hinted = plain.objectValue!
        hinted["runtime_hints"] = .array([
            rule(JSONObject([("gpu", .string("adreno"))]), threads: 1),  // a key this client does not know: never matches
            rule(JSONObject([("cores", .int(6))]), threads: 4),
        ])
        try f.registry.publish("digits", stable: .object(hinted))
        let client = f.client()
        let first = await client.update(digits)
        #expect(first.ok, "\(first.error ?? "")")
        #expect(first.model?.runtime.threads == 4 && first.model?.runtime.backends == ["cpu"])
        #expect(first.model?.runtime.precision == "normal" && first.model?.runtimeRule == 1)
        #expect(await client.current(digits).model?.runtime.threads == 4, "kept with the install")
        try f.registry.publish("digits", stable: plain)
        let after = await client.update(digits)
        #expect(after.ok && !after.updated, "\(after.error ?? "")")
        #expect(after.model?.runtime.threads == 2 && after.model?.runtime.backends == ["opencl", "cpu"] && after.model?.runtimeRule == nil)
        #expect(f.server.requests.filter { $0.path.contains("blobs/") }.count == 1, "a hint never changes the blob")
    }

    @Test func resumesAnInterruptedDownloadWithRange() async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        try f.registry.publish("digits", stable: v1)
        f.server.dropAfter(v1["path"]!.stringValue!, 10_000)
        let client = f.client()
        let cut = await client.update(digits)
        #expect(cut.errorCode == "transport" && cut.version == nil)
        let pending = await client.status(digits).pending
        #expect(pending?.version == "1.0.0" && pending?.remainingBytes == 30_000)
        let resumed = await client.update(digits)
        #expect(resumed.ok && resumed.version == "1.0.0")
        #expect(resumed.downloadedBytes == 30_000)
        #expect(f.server.log.contains { $0.status == 206 })
        #expect(await client.status(digits).pending == nil)
    }

    @Test func aLargeBlobStreamsToDisk() async throws {
        let f = try Fixture()
        let big = try f.registry.entry("digits", "1.0.0", size: 24_000_000)
        try f.registry.publish("digits", stable: big)
        let r = await f.client().update(digits)
        #expect(r.ok && r.downloadedBytes == 24_000_000, "\(r.error ?? "")")
        #expect(SHA256Hasher.hex(try Data(contentsOf: try #require(r.path))) == big["sha256"]?.stringValue)
    }

    @Test func theSocketTransportFromASourceAddressDoesTheSame() async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        try f.registry.publish("digits", stable: v1, reportURL: "v1/reports")
        f.server.dropAfter(v1["path"]!.stringValue!, 10_000)
        let client = f.client(reporting: true, sourceAddress: "127.0.0.2")
        #expect(await client.update(digits).errorCode == "transport")
        let resumed = await client.update(digits)
        #expect(resumed.ok && resumed.downloadedBytes == 30_000, "\(resumed.error ?? "")")
        let again = await client.update(digits)
        #expect(again.notModified)
        #expect(await client.flushReports() == 1)
        #expect(ReportSchema.refusal(try #require(f.server.reports.first)) == nil)
    }

    @Test(arguments: [(true, nil), (false, nil), (true, "127.0.0.2"), (false, "127.0.0.2")] as [(Bool, String?)])
    func aShortCompleteAnswerIsABadBlobNotATransportFailure(announced: Bool, source: String?) async throws {
        // Rule 14: a complete answer of fewer bytes is another file; asking again brings the
        // same bytes, so it is bad-blob (never a transport failure retried forever).
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        try f.registry.publish("digits", stable: v1)
        let path = v1["path"]!.stringValue!
        let whole = try Data(contentsOf: f.registry.root.appendingPathComponent(path))
        f.server.override(path, whole.dropLast())
        if !announced { f.server.omitLength(path) }
        let client = f.client(sourceAddress: source)
        for _ in 0..<2 {
            let r = await client.update(digits)
            #expect(r.errorCode == "bad-blob" && r.version == nil, "\(r.error ?? "")")
            #expect(parts(f.cache).isEmpty, "no .part is kept for a resume")
        }
        if announced {
            // Refused on the headers: not one body byte was written.
            #expect(await client.update(digits).error?.contains("announces") == true)
        }
    }

    @Test(arguments: [nil, "127.0.0.2"] as [String?])
    func aResumeFromAServerWhoseFileIsNowShorterIsABadBlob(source: String?) async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        try f.registry.publish("digits", stable: v1)
        let path = v1["path"]!.stringValue!
        f.server.dropAfter(path, 10_000)  // Content-Length announced, then the connection cut
        let client = f.client(sourceAddress: source)
        let cut = await client.update(digits)
        #expect(cut.errorCode == "transport", "\(cut.error ?? "")")
        #expect(await client.status(digits).pending?.remainingBytes == 30_000)
        let whole = try Data(contentsOf: f.registry.root.appendingPathComponent(path))
        f.server.override(path, whole.dropLast(10))
        let shorter = await client.update(digits)
        #expect(shorter.errorCode == "bad-blob" && shorter.version == nil, "\(shorter.error ?? "")")
        #expect(parts(f.cache).isEmpty)
    }

    @Test func concurrentCallsTakeTurns() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0", size: 2_000_000))
        let client = f.client()
        let results = await withTaskGroup(of: UpdateResult.self) { group in
            for _ in 0..<5 { group.addTask { await client.update(digits) } }
            group.addTask { await client.revert(digits, reason: "racing") }
            var out: [UpdateResult] = []
            for await r in group { out.append(r) }
            return out
        }
        #expect(results.allSatisfy { $0.errorCode == nil || $0.errorCode == "bad-release" }, "\(results.map { $0.error ?? "" })")
        #expect(results.reduce(0) { $0 + $1.downloadedBytes } == 2_000_000, "one download, never two into one .part")
    }

    @Test func aTricklingServerIsGivenUpOnAndTheBlobResumes() async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        try f.registry.publish("digits", stable: v1)
        f.server.trickle(v1["path"]!.stringValue!)
        let slow = await f.client(limits: Limits(timeout: 1, deadline: 60, minRate: 100_000)).update(digits)
        #expect(slow.errorCode == "transport", "\(slow.error ?? "")")
        let late = await f.client(limits: Limits(timeout: 30, deadline: 1, minRate: 1)).update(digits)
        #expect(late.errorCode == "transport", "\(late.error ?? "")")
        let part = Files.size(f.cache.appendingPathComponent("blobs/\(v1["sha256"]!.stringValue!).part")) ?? 0
        #expect(part > 0, "the bytes so far stay for a resume")
    }

    /// Issue #30: a redirect to file:///etc/passwd was reported as `not-found` ("answered 404").
    /// Only http(s) redirects are followed; any other is a transport failure naming it.
    @Test(arguments: [nil, "127.0.0.2"] as [String?])
    func aRedirectToAnotherSchemeIsATransportFailureNotNotFound(source: String?) async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        try f.registry.publish("digits", stable: v1)
        for location in ["file:///etc/passwd", "ftp://127.0.0.1/manifests/digits/high.json"] {
            f.server.redirect("manifests/digits/high.json", to: location)
            let result = await f.client(sourceAddress: source, limits: Limits(timeout: 5, deadline: 30)).update(digits)
            #expect(result.errorCode == "transport", "\(location): \(result.error ?? "")")
            #expect(result.error?.contains("redirect") == true, "\(location): \(result.error ?? "")")
            #expect(result.error?.contains("404") == false, "\(location): \(result.error ?? "")")
            #expect(result.model == nil)
        }
        // URLSession still follows an http(s) redirect (a CDN may send one).
        guard source == nil else { return }
        f.server.redirect("manifests/digits/high.json", to: f.server.url.absoluteString + "manifests/digits/copy.json")
        try FileManager.default.copyItem(at: f.registry.root.appendingPathComponent("manifests/digits/high.json"),
                                         to: f.registry.root.appendingPathComponent("manifests/digits/copy.json"))
        let followed = await f.client(sourceAddress: source).update(digits)
        #expect(followed.ok, "\(followed.error ?? "")")
    }

    /// README.md's start, as written there (the names it leaves to the app are locals here).
    @Test func theReadmeStartWorks() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0", probe: FakeRunner.probe()))
        let registryPublicKeyPEM = f.registry.publicPEM, installID = deviceID(inside: true), appSupport = f.dir
        let tierRules: [(String, TierRules)] = [("high", TierRules(minRamMB: 4096)), ("low", TierRules())]
        func MNNRunner() -> FakeRunner { FakeRunner() }
        var loaded: [String] = []
        func load(_ path: URL, _ backend: String?, _ contract: IOContract?, _ labels: [String]?) { loaded.append(backend ?? "") }

        let client = EdgeRegClient(ClientConfiguration(
            registry: f.server.url,
            trustedKeys: TrustedKeys(pems: [registryPublicKeyPEM])!,
            cacheDirectory: appSupport.appendingPathComponent("models"),
            device: DeviceFacts(deviceID: installID, ramMB: 6144, cpuCores: 6, soc: "Apple A15", os: "ios",
                                osVersion: "17.2", mnnRuntime: "3.6.1", appVersion: "2.4.0"),
            tiers: tierRules,                 // or tier: "high"
            runner: MNNRunner(), selfTest: true))
        if await client.appStarted(.model("digits")).reverted { /* a crash loop was taken back */ }
        let result = await client.update(.model("digits"))   // never throws: errorCode + the last good model
        if let model = result.model { load(model.path, model.backend, model.contract, model.labels) }
        await client.confirm(.model("digits"), version: result.version)  // after the first real inference

        #expect(client.tier == "high" && loaded == ["opencl"])
        #expect(await client.status(.model("digits")).installed?.version == "1.0.0")
    }

    @Test func aServerIgnoringRangesStartsOver() async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        try f.registry.publish("digits", stable: v1)
        f.server.dropAfter(v1["path"]!.stringValue!, 10_000)
        f.server.setRanges(false)
        let client = f.client()
        _ = await client.update(digits)
        let full = await client.update(digits)
        #expect(full.ok && full.downloadedBytes == 40_000)
    }

    @Test func aBundleInstallsAsOneSet() async throws {
        let f = try Fixture()
        let b1 = try f.registry.bundleEntry("1.0.0")
        try f.registry.publish("ocr", stable: b1)
        let client = f.client()
        let first = await client.update(ocr)
        #expect(first.ok && first.members.keys.sorted() == ["cls", "det", "rec"])
        let b2 = try f.registry.bundleEntry("1.1.0")
        try f.registry.publish("ocr", stable: b1, candidate: b2, percent: 100)
        f.server.dropAfter(b2["members"]!["rec"]!["path"]!.stringValue!, 100)
        let half = await client.update(ocr)
        #expect(half.errorCode == "transport")
        #expect(half.members.values.allSatisfy { $0.version == "1.0.0" }, "a partly downloaded set never becomes active")
        #expect(await client.current(ocr).members.values.allSatisfy { $0.version == "1.0.0" })
        let full = await client.update(ocr)
        #expect(full.ok && full.isCandidate && full.members.values.allSatisfy { $0.version == "1.1.0" })
        #expect(await client.status(ocr).previous?.version == "1.0.0")
        // A bundle's manifest asked as a model is malformed; the model asked stays what it was.
        #expect(await client.update(.model("ocr")).errorCode == "malformed")
    }

    @Test func rollbackExpiryAndTamperingKeepTheLastGood() async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        try f.registry.publish("digits", stable: v1, sequence: 5)
        let client = f.client()
        #expect(await client.update(digits).ok)
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "0.9.0"), sequence: 4)
        let rolled = await client.update(digits)
        #expect(rolled.errorCode == "rollback" && rolled.version == "1.0.0")
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.1.0"), expires: "2020-01-01T00:00:00Z", sequence: 6)
        let expired = await client.update(digits)
        #expect(expired.errorCode == "expired" && expired.version == "1.0.0")
        let v2 = try f.registry.entry("digits", "1.2.0")
        try f.registry.publish("digits", stable: v2, sequence: 7)
        f.server.override(v2["path"]!.stringValue!, Data(repeating: 7, count: 40_000))
        let tampered = await client.update(digits)
        #expect(tampered.errorCode == "bad-blob" && tampered.version == "1.0.0")
        #expect(!FileManager.default.fileExists(atPath: f.cache.appendingPathComponent("blobs/\(v2["sha256"]!.stringValue!).part").path))
        f.server.override(v2["path"]!.stringValue!, Data(repeating: 7, count: 40_001))
        #expect(await client.update(digits).errorCode == "blob-too-large")
        f.server.override(v2["path"]!.stringValue!, nil)
        #expect(await client.update(digits).version == "1.2.0")
        // The highest sequence survives a new client on the same cache (an app restart).
        try f.registry.publish("digits", stable: v1, sequence: 5)
        #expect(await f.client().update(digits).errorCode == "rollback")
        #expect(await client.update(.model("nothing")).errorCode == "not-found")
    }

    @Test func conditionsDeferAndAShortDiskRefusesBeforeAnyByte() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"))
        let metered = await f.client(policy: DownloadPolicy(allowMetered: false)).update(digits, conditions: Conditions(metered: true))
        #expect(metered.ok && metered.deferred == "metered" && metered.version == nil)
        let unknown = await f.client(policy: DownloadPolicy(requireCharging: true)).update(digits, conditions: Conditions(charging: nil))
        #expect(unknown.deferred == "not-charging", "an unknown condition counts as unmet")
        #expect(await f.client().status(digits).pending?.deferred == "not-charging")
        // The shortest form says nothing: with Wi-Fi only it waits instead of using cellular.
        #expect(await f.client(policy: DownloadPolicy(allowMetered: false)).update(digits).deferred == "metered")
        let overnight = DownloadPolicy(requireIdle: true, requireStorageNotLow: true)
        #expect(await f.client(policy: overnight).update(digits, conditions: Conditions(idle: true)).deferred == "storage-low")
        #expect(await f.client(policy: overnight).update(digits, conditions: Conditions(storageLow: false)).deferred == "not-idle")
        #expect(f.server.bodyBytes("blobs/") == 0, "nothing downloaded while a condition is unknown")
        f.server.resetLog()
        let full = await f.client(policy: DownloadPolicy(reserveBytes: 1 << 60)).update(digits)
        #expect(full.errorCode == "no-space")
        #expect(f.server.bodyBytes("blobs/") == 0, "nothing was downloaded")
        #expect(await f.client().update(digits).ok)
    }

    @Test func selfTestSkipsAMiscomputingBackendAndChoosesCPU() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0", backends: ["metal", "opencl", "cpu"], probe: FakeRunner.probe()))
        let runner = FakeRunner(faulty: ["opencl"], unavailable: ["metal"])
        let r = await f.client(selfTest: true, runner: runner).update(digits)
        #expect(r.ok && r.model?.backend == "cpu", "\(r.error ?? "")")
        #expect(runner.loads == ["metal", "opencl", "cpu"])
        // The failing backend is remembered for this artifact; the unavailable one is not.
        let memory = try StrictJSON.parse(Data(contentsOf: f.cache.appendingPathComponent("selftest.json")))
        #expect(memory["digits"]?["1.0.0"]?["failed"]?["opencl"] != nil)
        #expect(memory["digits"]?["1.0.0"]?["failed"]?["metal"] == nil)
    }

    @Test func aStatefulProbeFeedsItsStateBackFromZeros() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0", probe: StatefulRunner.probe()))
        let r = await f.client(selfTest: true, runner: StatefulRunner(declares: true)).update(digits)
        #expect(r.ok && r.model?.backend == "opencl", "\(r.error ?? "")")
        // Without a contract and without declared shapes there is nothing to zero.
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.1.0", probe: StatefulRunner.probe()))
        let none = await f.client(selfTest: true, runner: StatefulRunner(declares: false)).update(digits)
        #expect(none.errorCode == "probe-failed" && none.version == "1.0.0")
    }

    @Test func aModelFailingOnEveryBackendIsRefusedForGood() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0", probe: FakeRunner.probe()))
        #expect(await f.client(selfTest: true, runner: FakeRunner()).update(digits).ok)
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.1.0", probe: FakeRunner.probe()))
        let runner = FakeRunner(faulty: ["opencl", "cpu"])
        let r = await f.client(selfTest: true, runner: runner).update(digits)
        #expect(r.errorCode == "probe-failed" && r.version == "1.0.0")
        let again = await f.client(selfTest: true, runner: runner).update(digits)
        #expect(again.errorCode == "bad-release" && again.version == "1.0.0")
        #expect(runner.loads == ["opencl", "cpu"], "never tried again")
        #expect(await f.client().status(digits).badReleases["1.1.0"] != nil)
    }

    @Test func aProbeThatDidNotRunIsNoFailureAndTheNextUpdateInstalls() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0", backends: ["opencl", "cpu"], probe: FakeRunner.probe()),
                               reportURL: "v1/reports")
        // The MNN library is missing from the app: no backend at all, the CPU included.
        let broken = FakeRunner(unavailable: ["opencl", "cpu"])
        let client = f.client(selfTest: true, runner: broken, reporting: true)
        let r = await client.update(digits)
        #expect(r.errorCode == "probe-not-run" && r.version == nil, "\(r.error ?? "")")
        let status = await client.status(digits)
        #expect(status.badReleases.isEmpty, "never marked bad")
        #expect(status.pending?.version == "1.0.0", "still pending")
        _ = await client.flushReports()
        #expect(f.server.reports.isEmpty, "never reported as a probe failure")
        let fixed = await f.client(selfTest: true, runner: FakeRunner(), reporting: true).update(digits)
        #expect(fixed.ok && fixed.model?.backend == "opencl", "\(fixed.error ?? "")")
    }

    @Test func aConfigurationWithTheSelfTestAndNoRunnerSaysItsProblem() throws {
        let f = try Fixture()
        let config = ClientConfiguration(registry: f.server.url, trustedKeys: f.registry.trusted, cacheDirectory: f.cache,
                                         device: DeviceFacts(deviceID: "d"), tier: "high", selfTest: true)
        #expect(config.problem?.contains("no model runner") == true)
        var fine = config
        fine.selfTest = false
        #expect(fine.problem == nil)
    }

    @Test func aClientWithTheSelfTestAndNoRunnerStopsAtItsConstruction() async {
        // A programming error at the call site: the process stops, naming the fix.
        await #expect(processExitsWith: .failure) {
            let config = ClientConfiguration(
                registry: URL(string: "http://127.0.0.1:9/")!, trustedKeys: TrustedKeys([PublicKey(raw: Data(count: 32))!]),
                cacheDirectory: URL(fileURLWithPath: "/tmp/never-used"), device: DeviceFacts(deviceID: "d"), tier: "high",
                selfTest: true)
            _ = EdgeRegClient(config)
        }
    }

    @Test func aCrashLoopRevertsToTheLastGood() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"))
        let client = f.client()
        #expect(await client.update(digits).ok)
        #expect(await client.appStarted(digits).reverted == false)
        #expect(await client.confirm(digits, version: "1.0.0"))
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.1.0"))
        #expect(await client.update(digits).version == "1.1.0")
        #expect(await client.confirm(digits, version: "1.0.0") == false, "a confirmation of another version does not count")
        // Installed after appStarted: this start runs 1.1.0 (and crashes); the next starts count
        // 1, 2, and 3, which reverts (three runs); the last good then runs confirmed.
        var outcomes: [Bool] = []
        for _ in 0..<4 { outcomes.append(await client.appStarted(digits).reverted) }
        #expect(outcomes == [false, false, true, false])
        #expect(await client.current(digits).version == "1.0.0")
        #expect(await client.status(digits).lastError?.code == "reverted")
        #expect(await client.update(digits).errorCode == "bad-release")
        #expect(await client.current(digits).version == "1.0.0")
    }

    @Test func evictionKeepsTheInstalledAndTheLastGoodSet() async throws {
        let f = try Fixture()
        let client = f.client()
        var shas: [String] = []
        for version in ["1.0.0", "1.1.0", "1.2.0"] {
            let e = try f.registry.entry("digits", version)
            shas.append(e["sha256"]!.stringValue!)
            try f.registry.publish("digits", stable: e)
            #expect(await client.update(digits).version == version)
        }
        let blobs = Set(try FileManager.default.contentsOfDirectory(atPath: f.cache.appendingPathComponent("blobs").path))
        #expect(blobs == Set(shas.suffix(2)))
        let reverted = await client.revert(digits, reason: "the app says so")
        #expect(reverted.version == "1.1.0", "a revert needs no network")
    }

    @Test func aShippedReleaseInstallsOfflineAndANewerOneReplacesIt() async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        let envelope = try f.registry.publish("digits", stable: v1, expires: "2020-01-01T00:00:00Z")
        let shipped = BundledRelease(manifest: envelope, blobsDirectory: f.registry.root.appendingPathComponent("blobs/sha256"))
        let offline = f.client(registryURL: URL(string: "http://127.0.0.1:9/")!, bundled: ["digits": shipped])
        let first = await offline.current(digits)
        #expect(first.version == "1.0.0" && first.bundled, "expiry is not checked for the copy inside the app")
        let down = await offline.update(digits)
        #expect(down.errorCode == "transport" && down.version == "1.0.0")
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.1.0"))
        let online = await f.client(bundled: ["digits": shipped]).update(digits)
        #expect(online.ok && online.version == "1.1.0" && !online.bundled)
        #expect(await f.client(bundled: ["digits": shipped]).current(digits).version == "1.1.0", "never over a newer release")
    }

    @Test func aShippedSequenceNeverMakesAnOnlineManifestARollback() async throws {
        let f = try Fixture()
        let blobs = f.registry.root.appendingPathComponent("blobs/sha256")
        let huge: Int64 = 9_007_199_254_740_991  // 2^53 − 1, signed by the publisher by mistake
        let envelope = try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), sequence: huge)
        let shipped = BundledRelease(manifest: envelope, blobsDirectory: blobs)
        let offline = f.client(registryURL: URL(string: "http://127.0.0.1:9/")!, bundled: ["digits": shipped])
        let first = await offline.current(digits)
        #expect(first.version == "1.0.0" && first.bundled)
        #expect(try await offline.readSequence(digits) == nil, "a shipped manifest stores no highest sequence")
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.1.0"), sequence: 2)
        let online = await f.client(bundled: ["digits": shipped]).update(digits)
        #expect(online.ok && online.errorCode == nil && online.version == "1.1.0" && !online.bundled)
        #expect(try await f.client().readSequence(digits) == 2)
        // The next start: the shipped copy's sequence is above the installed one's, yet it stays out.
        let restarted = f.client(registryURL: URL(string: "http://127.0.0.1:9/")!, bundled: ["digits": shipped])
        let now = await restarted.current(digits)
        #expect(now.version == "1.1.0" && !now.bundled)
    }

    @Test func noShippedCopyIsInstalledAfterAnOnlineAcceptance() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), sequence: 5)
        #expect(await f.client().update(digits).version == "1.0.0")
        // An app update ships a newer release with a higher sequence; the device is offline.
        let envelope = try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.1.0"), sequence: 9)
        let shipped = BundledRelease(manifest: envelope, blobsDirectory: f.registry.root.appendingPathComponent("blobs/sha256"))
        let offline = f.client(registryURL: URL(string: "http://127.0.0.1:9/")!, bundled: ["digits": shipped])
        let now = await offline.current(digits)
        #expect(now.version == "1.0.0" && !now.bundled)
        let down = await offline.update(digits)
        #expect(down.errorCode == "transport" && down.version == "1.0.0" && !down.bundled)
        #expect(try await offline.readSequence(digits) == 5, "the shipped sequence is not stored")
    }

    @Test func aNewerShippedCopyReplacesAnOlderOneWhileNothingWasAcceptedOnline() async throws {
        let f = try Fixture()
        let blobs = f.registry.root.appendingPathComponent("blobs/sha256")
        let old = try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), sequence: 3)
        let offline = URL(string: "http://127.0.0.1:9/")!
        #expect(await f.client(registryURL: offline, bundled: ["digits": BundledRelease(manifest: old, blobsDirectory: blobs)])
            .current(digits).version == "1.0.0")
        let new = try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.1.0"), sequence: 4)
        #expect(await f.client(registryURL: offline, bundled: ["digits": BundledRelease(manifest: new, blobsDirectory: blobs)])
            .current(digits).version == "1.1.0")
        #expect(await f.client(registryURL: offline, bundled: ["digits": BundledRelease(manifest: old, blobsDirectory: blobs)])
            .current(digits).version == "1.1.0", "never below what is installed")
    }

    @Test func reportsReachTheCollectorValid() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0", probe: FakeRunner.probe()), reportURL: "v1/reports")
        let client = f.client(selfTest: true, runner: FakeRunner(), reporting: true)
        #expect(await client.update(digits).ok)
        #expect(await client.flushReports() == 1)
        // The app restarts: the confirmation is reported under the install's token.
        let restarted = f.client(reporting: true)
        await restarted.recordInference(digits, ms: 12.5)
        #expect(await restarted.confirm(digits))
        #expect(await restarted.flushReports() == 1)
        let reports = f.server.reports
        #expect(reports.count == 2)
        for body in reports { #expect(ReportSchema.refusal(body) == nil, "\(String(decoding: body, as: UTF8.self))") }
        let last = try StrictJSON.parse(reports[1])
        #expect(last["confirmed"]?.boolValue == true && last["probe"]?.stringValue == "passed")
        #expect(last["inference"]?["count"]?.intValue == 1)
        #expect(try StrictJSON.parse(reports[0])["token"] == last["token"], "one token per install")
    }

    @Test func aReportRefusedWith503IsTriedOnceMoreAfterARestart() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), reportURL: "v1/reports")
        f.server.failPosts(1)
        let client = f.client(reporting: true)
        #expect(await client.update(digits).ok)
        #expect(await client.flushReports() == 0)
        #expect(f.server.reports.isEmpty)
        let restarted = f.client(reporting: true)
        #expect(await restarted.update(digits).ok)  // a report is never a reason to fail an update
        _ = await restarted.flushReports()
        #expect(f.server.reports.count == 1, "kept for one more try, across the restart")
    }

    @Test func statusIsNotReadyWhenABlobWasDamaged() async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        try f.registry.publish("digits", stable: v1)
        let client = f.client()
        #expect(await client.update(digits).ok)
        let blob = f.cache.appendingPathComponent("blobs/\(v1["sha256"]!.stringValue!)")
        var data = try Data(contentsOf: blob)
        data[0] ^= 1
        try data.write(to: blob)
        #expect(await client.status(digits).ready == false)
        #expect(await client.status(digits, verify: false).ready == true)
    }

    @Test func anUnreadableSequenceFileRefusesToUpdate() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"))
        let client = f.client()
        #expect(await client.update(digits).ok)
        try Data("garbage".utf8).write(to: f.cache.appendingPathComponent("state/digits/sequence.json"))
        let r = await client.update(digits)
        #expect(r.errorCode == "cache" && r.version == "1.0.0")
    }
}

/// What a progress callback was told, from any thread.
final class ProgressLog: @unchecked Sendable {
    private let lock = NSLock()
    private var _seen: [(Int64, Int64)] = []
    func add(_ done: Int64, _ total: Int64) { lock.withLock { _seen.append((done, total)) } }
    var seen: [(Int64, Int64)] { lock.withLock { _seen } }
}

@Suite struct ControlTests {
    @Test func cancellingTheTaskStopsTheDownloadWithinASecondInstallsNothingAndKeepsThePart() async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0", size: 40_000)
        try f.registry.publish("digits", stable: v1)
        f.server.trickle(v1["path"]!.stringValue!)  // 2 KB/s: 20 s for the blob
        let client = f.client()
        let log = ProgressLog()
        let task = Task { await client.update(digits, progress: { log.add($0, $1) }) }
        let until = Date().addingTimeInterval(20)
        while log.seen.count < 5, Date() < until { try await Task.sleep(nanoseconds: 20_000_000) }
        #expect(log.seen.first.map { [$0.0, $0.1] } == [0, 40_000], "the total, before the first byte")
        let asked = Date()
        task.cancel()
        task.cancel()  // twice: nothing more happens
        let r = await task.value
        let took = Date().timeIntervalSince(asked)
        #expect(took < 1, "returned \(took) s after the cancel")
        #expect(r.errorCode == "cancelled" && r.version == nil, "\(r.error ?? "")")
        #expect(throws: CancellationError.self) { try r.get() }
        let status = await client.status(digits)
        #expect(status.installed == nil && status.pending?.version == "1.0.0")
        #expect((status.pending?.remainingBytes ?? 0) < 40_000, "the part is kept for a resume")
    }

    @Test func aCancelWhileTheManifestIsFetchedIsCancelledNotATransportError() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0", size: 1_000))
        let client = f.client()
        let asked = f.server.requests.count
        f.server.delayGets("manifests/digits/high.json", 1_500_000)
        let task = Task { await client.update(digits) }
        let until = Date().addingTimeInterval(10)
        while f.server.requests.count == asked, Date() < until { try await Task.sleep(nanoseconds: 10_000_000) }
        try await Task.sleep(nanoseconds: 100_000_000)  // the request is out, its answer held
        task.cancel()
        let r = await task.value
        // The connection the cancel cut is the cancel, not the network's failure.
        #expect(r.errorCode == "cancelled", "\(r.errorCode ?? "nil"): \(r.error ?? "")")
        #expect(await client.status(digits).lastError?.code == "cancelled")
        f.server.delayGets("manifests/digits/high.json", 0)
        #expect(await client.update(digits).updated)
    }

    @Test func progressEndsAtTheTotalAndNothingIsToldWhenNothingDownloads() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0", size: 300_000))
        let log = ProgressLog()
        let client = f.client()
        #expect(await client.update(digits, progress: { log.add($0, $1) }).updated)
        let seen = log.seen
        #expect(seen.first.map { [$0.0, $0.1] } == [0, 300_000])
        #expect(seen.last.map { [$0.0, $0.1] } == [300_000, 300_000])
        #expect(zip(seen, seen.dropFirst()).allSatisfy { $0.0 <= $1.0 }, "never goes back")
        let again = ProgressLog()
        _ = await client.update(digits, progress: { again.add($0, $1) })
        #expect(again.seen.isEmpty)
    }

    @Test func changesCheckDeleteAndTheInstalledList() async throws {
        let f = try Fixture()
        let v1 = try f.registry.entry("digits", "1.0.0")
        try f.registry.publish("digits", stable: v1)
        let client = f.client(policy: DownloadPolicy(allowMetered: false))
        let changes = await client.changes()
        let first = await client.check(digits)
        #expect(first.available && first.version == "1.0.0" && first.downloadBytes == 40_000)
        #expect(first.deferred == "metered", "the network was not said")
        let wifi = Conditions(metered: false)
        #expect(await client.update(digits, conditions: wifi).updated)
        #expect(await client.check(digits, conditions: wifi).available == false, "up to date")
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.1.0"))
        #expect(await client.update(digits, conditions: wifi).version == "1.1.0")
        try f.registry.publish("digits", stable: v1)  // the server takes 1.1.0 back
        #expect(await client.update(digits, conditions: wifi).version == "1.0.0")
        #expect(await client.installedUnits() == [InstalledUnit(unit: digits, version: "1.0.0", isCandidate: false)])
        #expect(await client.delete(digits))
        #expect(await client.delete(digits) == false, "twice: nothing more")
        #expect(await client.installedUnits().isEmpty)
        #expect(await client.current(digits).version == nil)
        var heard: [String] = []
        for await change in changes {
            heard.append("\(change.kind.rawValue) \(change.previous ?? "-") -> \(change.version ?? "-")")
            if heard.count == 4 { break }
        }
        #expect(heard == ["installed - -> 1.0.0", "installed 1.0.0 -> 1.1.0", "rolled-back 1.1.0 -> 1.0.0", "deleted 1.0.0 -> -"])
        // A failure as an error an app can catch.
        try f.registry.publish("digits", stable: v1, sequence: 1)
        let rolledBack = await client.update(digits, conditions: wifi)
        #expect(throws: EdgeRegError(code: "rollback", message: rolledBack.error ?? "")) { try rolledBack.get() }
    }
}
