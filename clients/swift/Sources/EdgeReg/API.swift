import Foundation

/// What installs as one: a model, or a bundle (models that ship together).
public enum ReleaseUnit: Sendable, Hashable, CustomStringConvertible {
    case model(String)
    case bundle(String)

    public var name: String {
        switch self {
        case .model(let n), .bundle(let n): return n
        }
    }

    public var isBundle: Bool { if case .bundle = self { return true } else { return false } }
    public var description: String { isBundle ? "bundle \(name)" : "model \(name)" }
}

/// The device's state now, as the platform says it (NWPathMonitor, UIDevice, the volume's
/// capacity). nil means unknown, which counts as unmet: `Conditions()` says nothing, so a
/// policy that requires Wi-Fi defers until the app says the network is not expensive.
public struct Conditions: Sendable, Equatable {
    public var metered: Bool?
    public var charging: Bool?
    public var idle: Bool?
    public var storageLow: Bool?

    public init(metered: Bool? = nil, charging: Bool? = nil, idle: Bool? = nil, storageLow: Bool? = nil) {
        self.metered = metered
        self.charging = charging
        self.idle = idle
        self.storageLow = storageLow
    }
}

/// When blobs may be downloaded, and the free space to leave (docs/protocol.md §8).
public struct DownloadPolicy: Sendable, Equatable {
    public var allowMetered: Bool
    public var requireCharging: Bool
    public var requireIdle: Bool
    public var requireStorageNotLow: Bool
    public var reserveBytes: Int64

    public init(allowMetered: Bool = true, requireCharging: Bool = false, requireIdle: Bool = false,
                requireStorageNotLow: Bool = false, reserveBytes: Int64 = 8 * 1024 * 1024) {
        self.allowMetered = allowMetered
        self.requireCharging = requireCharging
        self.requireIdle = requireIdle
        self.requireStorageNotLow = requireStorageNotLow
        self.reserveBytes = reserveBytes
    }

    /// Why a download must wait, or nil: the first unmet condition in the protocol's order,
    /// `metered`, `not-charging`, `not-idle`, `storage-low`. Unknown counts as unmet.
    public func unmet(_ c: Conditions) -> String? {
        if !allowMetered, c.metered != false { return "metered" }
        if requireCharging, c.charging != true { return "not-charging" }
        if requireIdle, c.idle != true { return "not-idle" }
        if requireStorageNotLow, c.storageLow != false { return "storage-low" }
        return nil
    }
}

/// A release shipped inside the app for the first offline launch (docs/protocol.md §10):
/// the manifest envelope bytes as served, and a folder of its blobs named by sha256.
public struct BundledRelease: Sendable {
    public var manifest: Data
    public var blobsDirectory: URL

    public init(manifest: Data, blobsDirectory: URL) {
        self.manifest = manifest
        self.blobsDirectory = blobsDirectory
    }

    func blob(_ sha256: String) -> URL? {
        for candidate in [blobsDirectory.appendingPathComponent(sha256),
                          blobsDirectory.appendingPathComponent("blobs/sha256/\(sha256)")]
        where FileManager.default.fileExists(atPath: candidate.path) {
            return candidate
        }
        return nil
    }
}

// MARK: - the app's model runner

/// A loaded model on one backend. The app implements it over its MNN framework.
public protocol ModelSession: Sendable {
    /// One forward pass: inputs by name, outputs by name.
    func run(_ inputs: [String: Tensor]) async throws -> [String: Tensor]
    func close() async
    /// The model's declared input shapes (a dynamic axis as -1 or 0), when the runtime says
    /// them: a state input without a contract starts as zeros of that shape.
    var inputShapes: [String: [Int]] { get }
}

extension ModelSession {
    public var inputShapes: [String: [Int]] { [:] }
}

/// The app's model runner: loads a verified artifact on a backend (docs/guides/ios.md shows
/// the MNN adapter). Throw `BackendUnavailable` when the device has no such backend (MNN
/// would fall back to the CPU silently: that is not a pass of the GPU).
public protocol ModelRunner: Sendable {
    /// Load `model` on `backend`; `outputs` are the tensors the self-test reads (the probe's
    /// expected outputs and state outputs; empty without a probe).
    func load(model: URL, backend: String, threads: Int, precision: String, outputs: [String]) async throws -> any ModelSession
    /// The MNN APIs this runner calls: `session` (`Interpreter::createSession`/`runSession`,
    /// the usual iOS code) and/or `module` (`MNN::Express::Module::load`). A model whose entry
    /// needs the Module API (an LSTM's While subgraph: the session API fails on it) is refused
    /// before download by a client whose runner does not say `module` (docs/protocol.md §7,
    /// fit rule (f)). Default: the session API.
    var mnnAPIs: Set<String> { get }
}

extension ModelRunner {
    public var mnnAPIs: Set<String> { ["session"] }
}

/// The backend does not exist on this device: skipped, not counted as failing (rule 16).
public struct BackendUnavailable: Error, Sendable {
    public let message: String
    public init(_ message: String) { self.message = message }
}

// MARK: - results

/// One installed, verified model: what the app loads and how it calls it.
public struct InstalledModel: Sendable {
    public let name: String
    public let path: URL
    public let version: String
    public let variant: String
    public let sha256: String
    /// The threads, backends and precision to run it with: the entry's declared `runtime`, or
    /// the threads and backends of the `runtime_hints` rule this device uses (`runtimeRule`;
    /// docs/protocol.md §11, "Runtime hints").
    public let runtime: RuntimeHints
    /// The index of the entry's `runtime_hints` rule behind `runtime`, or nil: the declared
    /// runtime (no rule matched this device, or it is outside the rule's percent).
    public let runtimeRule: Int?
    public let minMnnRuntime: String
    public let contract: IOContract?
    public let labels: [String]?
    public let probePath: URL?
    /// The backend the self-test chose (nil without a self-test).
    public let backend: String?
}

/// The outcome of `update` or `current`: never thrown, always the last good model.
public struct UpdateResult: Sendable {
    public let unit: ReleaseUnit
    public let tier: String?
    /// A reason code of docs/protocol.md §7 or a client code; nil when all went well.
    public let errorCode: String?
    public let error: String?
    public let version: String?
    public let isCandidate: Bool
    public let updated: Bool
    public let notModified: Bool
    public let fallback: String?
    /// `cpu-unsupported` when this update chose an entry's `instead` (a variant for devices
    /// with a CPU feature the entry avoids; the members show the one installed), else nil.
    public let substitute: String?
    public let deferred: String?
    public let bundled: Bool
    public let downloadedBytes: Int64
    /// Every member (a model: itself) of what is installed now.
    public let members: [String: InstalledModel]

    public var ok: Bool { errorCode == nil }
    public var runtimeFallback: Bool { fallback != nil }
    /// A model unit's one member.
    public var model: InstalledModel? { unit.isBundle ? nil : members[unit.name] }
    public var contract: IOContract? { model?.contract }
    public var labels: [String]? { model?.labels }
    public var path: URL? { model?.path }
}

/// A release verified but not installed yet.
public struct PendingRelease: Sendable, Equatable {
    public let version: String
    public let isCandidate: Bool
    public let totalBytes: Int64
    public let remainingBytes: Int64
    public let deferred: String?
    public let since: String
}

/// The last failure of an update: its code, message and time.
public struct LastError: Sendable, Equatable {
    public let code: String
    public let message: String
    public let at: String
}

/// One unit on this device, from the cache only.
public struct UnitStatus: Sendable {
    public struct SetInfo: Sendable, Equatable {
        public let version: String
        public let isCandidate: Bool
        public let bundled: Bool
        /// member -> (version, sha256)
        public let members: [String: (version: String, sha256: String)]

        public static func == (a: SetInfo, b: SetInfo) -> Bool {
            a.version == b.version && a.isCandidate == b.isCandidate && a.bundled == b.bundled
                && a.members.mapValues { "\($0.version) \($0.sha256)" } == b.members.mapValues { "\($0.version) \($0.sha256)" }
        }
    }

    public let unit: ReleaseUnit
    public let installed: SetInfo?
    public let previous: SetInfo?
    public let pending: PendingRelease?
    public let lastError: LastError?
    /// Versions refused for good on this device, with why.
    public let badReleases: [String: String]
    /// Every installed blob is present with its declared digest.
    public let ready: Bool
}

/// What `appStarted` did for a unit.
public struct StartOutcome: Sendable, Equatable {
    public let unit: ReleaseUnit
    public let reverted: Bool
    /// The unconfirmed version that was taken back.
    public let version: String?
    public let reason: String?
}

// MARK: - changes, checks, errors

/// A change of what is installed for a unit (`EdgeRegClient.changes()`, `addListener`).
public struct ModelChange: Sendable, Equatable {
    public enum Kind: String, Sendable {
        /// A newer (or the first) release was installed.
        case installed
        /// An update installed a lower version: the server took a release back.
        case rolledBack = "rolled-back"
        /// The app, or a crash loop, reverted the release.
        case reverted
        /// The app deleted the unit.
        case deleted
    }

    public let unit: ReleaseUnit
    public let kind: Kind
    /// What is installed now, or nil.
    public let version: String?
    /// What was installed before, or nil.
    public let previous: String?
}

/// What `check` found: whether an update would install a release, without downloading it.
public struct UpdateCheck: Sendable, Equatable {
    /// A release other than the installed one would install now.
    public let available: Bool
    /// The release this device would install (the installed one when up to date), or nil.
    public let version: String?
    /// The version installed now.
    public let installed: String?
    public let isCandidate: Bool
    /// Bytes an update would still download.
    public let downloadBytes: Int64
    /// Why an update would wait (an unmet condition), or nil.
    public let deferred: String?
    public let fallback: String?
    /// Why nothing can be installed (a reason code), or nil.
    public let errorCode: String?
    public let error: String?
}

/// One model or bundle installed in the client's cache.
public struct InstalledUnit: Sendable, Equatable {
    public let unit: ReleaseUnit
    public let version: String
    public let isCandidate: Bool
}

/// A failed update as an error an app can `catch` (`UpdateResult.get()`): the reason code
/// (docs/protocol.md §7, §10) and its message. A cancelled update throws `CancellationError`.
public struct EdgeRegError: Error, Sendable, Equatable, CustomStringConvertible {
    public let code: String
    public let message: String
    public var description: String { "\(code): \(message)" }
}

extension UpdateResult {
    /// This result, or its failure thrown: `CancellationError` for `cancelled`, else an
    /// `EdgeRegError` with the reason code. The last good model is installed either way.
    public func get() throws -> UpdateResult {
        guard let code = errorCode else { return self }
        if code == Reason.cancelled { throw CancellationError() }
        throw EdgeRegError(code: code, message: error ?? code)
    }
}
