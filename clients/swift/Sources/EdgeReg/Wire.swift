import Foundation

/// A payload that is not a valid document (reason `malformed`).
struct WireError: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

/// Reads known keys of a JSON object strictly; unknown keys are ignored
/// (docs/protocol.md §3, the compatibility rule).
struct Reader {
    let object: JSONObject
    let path: String

    init(_ value: JSONValue, _ path: String) throws(WireError) {
        guard let object = value.objectValue else { throw WireError("\(path) is a JSON \(value.kind), expected an object") }
        self.object = object
        self.path = path
    }

    func at(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    /// The value, nil when absent or (for optional fields) null.
    func optional(_ key: String) -> JSONValue? {
        guard let v = object[key], !v.isNull else { return nil }
        return v
    }

    func required(_ key: String) throws(WireError) -> JSONValue {
        guard let v = object[key] else { throw WireError("\(at(key)): missing") }
        return v
    }

    func string(_ key: String) throws(WireError) -> String {
        let v = try required(key)
        guard let s = v.stringValue else { throw WireError("\(at(key)) is a JSON \(v.kind), expected a string") }
        return s
    }

    func optionalString(_ key: String) throws(WireError) -> String? {
        guard let v = optional(key) else { return nil }
        guard let s = v.stringValue else { throw WireError("\(at(key)) is a JSON \(v.kind), expected a string") }
        return s
    }

    /// A JSON integer (never `9.0`, `"9"` or `true`) within bounds.
    func int(_ key: String, min: Int64, max: Int64) throws(WireError) -> Int64 {
        let v = try required(key)
        return try Reader.int(v, at(key), min: min, max: max)
    }

    static func int(_ v: JSONValue, _ where_: String, min: Int64, max: Int64) throws(WireError) -> Int64 {
        guard case .number(let n) = v, n.isInteger else { throw WireError("\(where_) is not an integer") }
        guard let i = n.int, i >= min, i <= max else { throw WireError("\(where_) is out of range \(min) to \(max)") }
        return i
    }

    /// Any JSON integer, however large (an unbounded strict int of the schema).
    static func anyInt(_ v: JSONValue, _ where_: String) throws(WireError) -> Int64? {
        guard case .number(let n) = v, n.isInteger else { throw WireError("\(where_) is not an integer") }
        return n.int
    }

    /// A JSON number (integer or not), never a boolean or a string.
    static func number(_ v: JSONValue, _ where_: String) throws(WireError) -> Double {
        guard case .number(let n) = v else { throw WireError("\(where_) is a JSON \(v.kind), expected a number") }
        return n.double
    }

    func bool(_ key: String, default value: Bool) throws(WireError) -> Bool {
        guard let v = object[key] else { return value }
        guard let b = v.boolValue else { throw WireError("\(at(key)) is a JSON \(v.kind), expected a boolean") }
        return b
    }

    func list(_ key: String) throws(WireError) -> [JSONValue]? {
        guard let v = optional(key) else { return nil }
        guard let a = v.arrayValue else { throw WireError("\(at(key)) is a JSON \(v.kind), expected an array") }
        return a
    }

    func requiredList(_ key: String) throws(WireError) -> [JSONValue] {
        let v = try required(key)
        guard let a = v.arrayValue else { throw WireError("\(at(key)) is a JSON \(v.kind), expected an array") }
        return a
    }

    func oneOf(_ key: String, _ allowed: [String]) throws(WireError) -> String? {
        guard let s = try optionalString(key) else { return nil }
        guard allowed.contains(s) else { throw WireError("\(at(key)) is '\(s)', expected one of \(allowed.joined(separator: ", "))") }
        return s
    }
}

// MARK: - entries

/// Backend names a manifest may hint (docs/protocol.md §3).
public let knownBackends = ["cpu", "opencl", "vulkan", "metal", "opengl", "coreml", "nnapi"]

/// Runtime hints: threads, backends (ending with `cpu`), precision.
public struct RuntimeHints: Sendable, Equatable {
    public let threads: Int
    public let backends: [String]
    public let precision: String

    init(_ value: JSONValue, _ path: String) throws(WireError) {
        let r = try Reader(value, path)
        threads = r.object["threads"] == nil ? 4 : Int(try r.int("threads", min: 1, max: 16))
        if let raw = r.object["backends"] {
            backends = try RuntimeHints.backendList(raw, r.at("backends"))
        } else {
            backends = ["cpu"]
        }
        if r.object["precision"] == nil {
            precision = "normal"
        } else {
            guard let p = try r.oneOf("precision", ["low", "normal", "high"]) else {
                throw WireError("\(r.at("precision")) is null")
            }
            precision = p
        }
    }

    init(threads: Int, backends: [String], precision: String) {
        (self.threads, self.backends, self.precision) = (threads, backends, precision)
    }

    /// A backend order (docs/protocol.md §3): known names, each once, ending with `cpu`.
    static func backendList(_ raw: JSONValue, _ where_: String) throws(WireError) -> [String] {
        guard let list = raw.arrayValue else { throw WireError("\(where_) is not a list") }
        var names: [String] = []
        for item in list {
            guard let s = item.stringValue, knownBackends.contains(s) else {
                throw WireError("\(where_): unknown backend")
            }
            names.append(s)
        }
        guard let last = names.last, last == "cpu" else {
            throw WireError("\(where_) must end with \"cpu\"")
        }
        guard Set(names).count == names.count else { throw WireError("\(where_): each backend may appear once") }
        return names
    }

    public var json: JSONValue {
        .object(JSONObject([
            ("threads", .int(threads)), ("backends", .array(backends.map { .string($0) })),
            ("precision", .string(precision)),
        ]))
    }
}

/// A blob in the registry by digest (`path` is always `blobs/sha256/<sha256>`).
public struct BlobRef: Sendable, Equatable, Hashable {
    public let path: String
    public let sha256: String
    public let size: Int64

    public init(sha256: String, size: Int64) {
        self.sha256 = sha256
        self.size = size
        path = Fields.blobPath(sha256)
    }

    init(_ value: JSONValue, _ path: String) throws(WireError) {
        let r = try Reader(value, path)
        try self.init(reader: r)
    }

    init(reader r: Reader) throws(WireError) {
        path = try r.string("path")
        sha256 = try r.string("sha256")
        size = try r.int("size", min: 1, max: Fields.maxSafeInteger)
        guard Fields.isBlobPath(path) else { throw WireError("\(r.at("path")) is not a blob path") }
        guard Fields.isSha256(sha256) else { throw WireError("\(r.at("sha256")) is not a sha256") }
        guard path == Fields.blobPath(sha256) else { throw WireError("\(r.at("path")) is not blobs/sha256/ + its sha256") }
    }
}

/// What a release needs of the app and the OS (`requires`).
public struct Requirements: Sendable, Equatable {
    public let app: String?
    public let android: String?
    public let ios: String?

    init(_ value: JSONValue, _ path: String) throws(WireError) {
        let r = try Reader(value, path)
        // Only the type here: the content is read at rule 12, where a bad range makes
        // the entry not fit (docs/protocol.md §7, "Version ranges").
        func range(_ key: String) throws(WireError) -> String? { try r.optionalString(key) }
        app = try range("app")
        android = try range("android")
        ios = try range("ios")
    }
}

/// One tensor of a contract; a dimension is a size or the name of a dynamic axis.
public struct TensorSpec: Sendable, Equatable {
    public enum Dim: Sendable, Equatable {
        case size(Int64)
        case named(String)
    }

    public let name: String
    public let dtype: String
    public let shape: [Dim]

    static let dtypes = ["float32", "float16", "int8", "uint8", "int32", "int64", "bool"]

    init(reader r: Reader) throws(WireError) {
        name = try TensorSpec.tensorName(r, "name")
        guard let d = try r.oneOf("dtype", TensorSpec.dtypes) else { throw WireError("\(r.at("dtype")): missing") }
        dtype = d
        var dims: [Dim] = []
        for (i, item) in try r.requiredList("shape").enumerated() {
            let at = "\(r.at("shape"))[\(i)]"
            if let s = item.stringValue {
                guard Fields.isDimName(s) else { throw WireError("\(at) is not a dimension name") }
                dims.append(.named(s))
            } else {
                guard let v = try Reader.anyInt(item, at), v >= 0 else { throw WireError("\(at) is not a size") }
                dims.append(.size(v))
            }
        }
        shape = dims
    }

    static func tensorName(_ r: Reader, _ key: String) throws(WireError) -> String {
        let s = try r.string(key)
        guard (1...256).contains(Fields.length(s)) else { throw WireError("\(r.at(key)) must be 1 to 256 characters") }
        return s
    }
}

/// An input, with what the app must do to its data first.
public struct InputTensor: Sendable, Equatable {
    public let spec: TensorSpec
    public let batchAxis: Int64?
    public let kind: String
    public let layout: String?
    public let color: String?
    public let mean: [Double]?
    public let std: [Double]?

    init(_ value: JSONValue, _ path: String) throws(WireError) {
        let r = try Reader(value, path)
        spec = try TensorSpec(reader: r)
        if let v = r.optional("batch_axis") {
            guard let a = try Reader.anyInt(v, r.at("batch_axis")) else { throw WireError("\(r.at("batch_axis")) too large") }
            batchAxis = a
        } else {
            batchAxis = nil
        }
        if r.object["kind"] == nil {
            kind = "tensor"
        } else {
            guard let k = try r.oneOf("kind", ["tensor", "image"]) else { throw WireError("\(r.at("kind")) is null") }
            kind = k
        }
        layout = try r.oneOf("layout", ["NCHW", "NHWC"])
        color = try r.oneOf("color", ["RGB", "BGR", "GRAY"])
        func floats(_ key: String) throws(WireError) -> [Double]? {
            guard let list = try r.list(key) else { return nil }
            var out: [Double] = []
            for (i, item) in list.enumerated() { out.append(try Reader.number(item, "\(r.at(key))[\(i)]")) }
            return out
        }
        mean = try floats("mean")
        std = try floats("std")
    }
}

/// How to call a model (docs/protocol.md §3.2): inputs, outputs, state pairs, task, labels.
public struct IOContract: Sendable, Equatable {
    public struct StateLink: Sendable, Equatable {
        public let input: String
        public let output: String
    }

    public struct Task: Sendable, Equatable {
        public let kind: String
        public let output: String?
        public let threshold: Double?
        public let blank: Int64?
    }

    public let inputs: [InputTensor]
    public let outputs: [TensorSpec]
    public let state: [StateLink]
    public let task: Task
    public let labels: [String]?
    public let labelsBlob: BlobRef?
    /// `module`: the artifact runs only through MNN's Module API (control-flow subgraphs);
    /// nil: the session API runs it too (fit rule (f)).
    public let mnnAPI: String?
    /// The contract as published (for apps that read keys this client does not model).
    public let json: JSONValue

    init(_ value: JSONValue, _ path: String) throws(WireError) {
        let r = try Reader(value, path)
        json = value
        var ins: [InputTensor] = []
        for (i, item) in try r.requiredList("inputs").enumerated() { ins.append(try InputTensor(item, "\(r.at("inputs"))[\(i)]")) }
        var outs: [TensorSpec] = []
        for (i, item) in try r.requiredList("outputs").enumerated() {
            outs.append(try TensorSpec(reader: Reader(item, "\(r.at("outputs"))[\(i)]")))
        }
        guard !ins.isEmpty, !outs.isEmpty else { throw WireError("\(path) needs at least one input and one output") }
        inputs = ins
        outputs = outs
        var links: [StateLink] = []
        if r.object["state"] != nil {
            guard let list = r.object["state"]?.arrayValue else { throw WireError("\(r.at("state")) is not a list") }
            for (i, item) in list.enumerated() {
                let lr = try Reader(item, "\(r.at("state"))[\(i)]")
                links.append(StateLink(input: try TensorSpec.tensorName(lr, "input"), output: try TensorSpec.tensorName(lr, "output")))
            }
        }
        state = links
        let tr = try Reader(try r.required("task"), r.at("task"))
        let kind = try tr.string("kind")
        guard Fields.isTaskKind(kind) else { throw WireError("\(tr.at("kind")) is not a task kind") }
        var output: String?
        if tr.optional("output") != nil { output = try TensorSpec.tensorName(tr, "output") }
        var threshold: Double?
        if let v = tr.optional("threshold") { threshold = try Reader.number(v, tr.at("threshold")) }
        var blank: Int64?
        if let v = tr.optional("blank") { blank = try Reader.anyInt(v, tr.at("blank")) ?? Int64.max }
        task = Task(kind: kind, output: output, threshold: threshold, blank: blank)
        if let list = try r.list("labels") {
            var out: [String] = []
            for item in list {
                guard let s = item.stringValue else { throw WireError("\(r.at("labels")) holds a non-string") }
                out.append(s)
            }
            labels = out
        } else {
            labels = nil
        }
        labelsBlob = try r.optional("labels_blob").map { (v) throws(WireError) in try BlobRef(v, r.at("labels_blob")) }
        if labels != nil, labelsBlob != nil { throw WireError("\(path): labels and labels_blob are exclusive") }
        mnnAPI = try r.oneOf("mnn_api", ["session", "module"])
        let inNames = Set(inputs.map(\.spec.name)), outNames = Set(outputs.map(\.name))
        for link in state where !inNames.contains(link.input) || !outNames.contains(link.output) {
            throw WireError("\(path): state \(link.input) <- \(link.output) names a tensor the contract lacks")
        }
        if let o = task.output, !outNames.contains(o) { throw WireError("\(path): task.output '\(o)' is not an output") }
    }
}

/// An app metric a release declares (docs/protocol.md §3, "App metrics"): what the app counts
/// about how well the model does its job. Only counts leave the device, never a value.
public struct AppMetric: Sendable, Equatable {
    public enum Kind: String, Sendable {
        /// Events, and those that succeeded (`EdgeRegClient.record`).
        case rate
        /// Values counted in fixed buckets (`EdgeRegClient.observe`).
        case distribution
    }

    /// App metrics an entry declares at most.
    public static let maxMetrics = 16
    /// Bucket edges of a distribution at most (so at most 32 buckets).
    public static let maxEdges = 31

    public let name: String
    public let kind: Kind
    /// A distribution's edges e1 < … < eK: K + 1 buckets, (−inf, e1], (e1, e2], …, (eK, +inf).
    /// Empty for a rate.
    public let buckets: [Double]

    /// The bucket a value falls in, 0 to K: the first whose edge is at least the value (a value
    /// equal to an edge falls in the bucket that edge closes), K above the last edge.
    public func bucket(for value: Double) -> Int {
        var lo = 0, hi = buckets.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if buckets[mid] < value { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    /// The declaration as the wire says it: `kind`, and a distribution's `buckets`.
    var json: JSONValue {
        var o = JSONObject()
        o["kind"] = .string(kind.rawValue)
        if kind == .distribution { o["buckets"] = .array(buckets.map { .double($0) }) }
        return .object(o)
    }

    /// Declarations by name as the wire says them (sorted by name).
    static func json(_ metrics: [String: AppMetric]) -> JSONValue {
        .object(JSONObject(metrics.keys.sorted().map { ($0, metrics[$0]!.json) }))
    }

    /// A unit's declarations (docs/protocol.md §3): 1 to 16 names, each a `rate` or a
    /// `distribution` of 1 to 31 finite, strictly increasing edges; an unknown key of a
    /// declaration is ignored. Nil when absent or null.
    static func declarations(_ value: JSONValue?, _ path: String) throws(WireError) -> [String: AppMetric]? {
        guard let value, !value.isNull else { return nil }
        guard let o = value.objectValue else { throw WireError("\(path) is a JSON \(value.kind), expected an object") }
        guard (1...maxMetrics).contains(o.keys.count) else {
            throw WireError("\(path) declares \(o.keys.count) metrics, expected 1 to \(maxMetrics)")
        }
        var out: [String: AppMetric] = [:]
        for name in o.keys {
            let at = "\(path).\(name)"
            guard Fields.isName(name) else {
                throw WireError("\(at): '\(name)' is not a metric name (a lowercase letter, then up to 62 lowercase letters, digits, '_' or '-')")
            }
            let r = try Reader(o[name]!, at)
            let kind = try r.string("kind")
            switch kind {
            case Kind.rate.rawValue:
                out[name] = AppMetric(name: name, kind: .rate, buckets: [])
            case Kind.distribution.rawValue:
                let edges = try r.requiredList("buckets")
                guard (1...maxEdges).contains(edges.count) else {
                    throw WireError("\(r.at("buckets")) has \(edges.count) edges, expected 1 to \(maxEdges)")
                }
                var buckets: [Double] = []
                for (i, item) in edges.enumerated() {
                    let edge = try Reader.number(item, "\(r.at("buckets"))[\(i)]")
                    guard edge.isFinite else { throw WireError("\(r.at("buckets"))[\(i)] is not a finite number") }
                    if let last = buckets.last, !(edge > last) {
                        throw WireError("\(r.at("buckets")) must increase strictly, got \(last) then \(edge)")
                    }
                    buckets.append(edge)
                }
                out[name] = AppMetric(name: name, kind: .distribution, buckets: buckets)
            default:
                throw WireError("\(r.at("kind")) is '\(kind)', expected rate or distribution")
            }
        }
        return out
    }

    /// Declarations an install record keeps; what does not read is left out.
    static func stored(_ value: JSONValue?) -> [String: AppMetric]? {
        guard let o = value?.objectValue else { return nil }
        var out: [String: AppMetric] = [:]
        for name in o.keys {
            if let one = try? declarations(.object(JSONObject([(name, o[name]!)])), "metrics") { out.merge(one) { $1 } }
        }
        return out
    }
}

/// One model release as an app of one tier sees it.
public struct ModelEntry: Sendable, Equatable {
    public let version: String
    public let variant: String
    public let path: String
    public let sha256: String
    public let size: Int64
    public let minMnnRuntime: String
    public let runtime: RuntimeHints
    public let contract: IOContract?
    public let requires: Requirements?
    public let probe: BlobRef?
    /// The probe's tensors too large to inline (docs/protocol.md §11); nil when none.
    public let probeData: BlobRef?
    /// Measured peak memory in MiB (fit rule (d)); nil when not measured.
    public let peakMemoryMB: Double?
    /// CPU features this variant must not run on (fit rule (e)); nil when none.
    public let avoidCPU: [String]?
    /// Held in an array: a struct cannot hold an optional of itself.
    private let insteadStorage: [ModelEntry]
    /// The entry a device with an avoided CPU feature installs in this one's place.
    public var instead: ModelEntry? { insteadStorage.first }
    /// The app metrics the release declares (§3, "App metrics"), or nil: this entry's own, or,
    /// for an `instead` (which declares none), its entry's. A bundle's are on `BundleEntry`.
    public let metrics: [String: AppMetric]?
    /// This entry itself declares `metrics` on the wire (an instead never does).
    let declaresMetrics: Bool
    /// The try-set (§3, "Runtime trials and hints"), or nil: nothing to try.
    public let runtimeTrials: RuntimeTrials?
    /// The hint rules in order (§11, "Runtime hints"), or nil: every device uses `runtime`.
    public let runtimeHints: [HintRule]?
    /// The entry as published (stored in the install pointer).
    public let json: JSONValue

    /// `insteadOf`: the outer entry's metrics when this is its `instead` (nil for an entry of its own).
    init(_ value: JSONValue, _ path: String, insteadOf outer: [String: AppMetric]?? = nil) throws(WireError) {
        let r = try Reader(value, path)
        json = value
        version = try r.string("version")
        guard SemVer(version) != nil else { throw WireError("\(r.at("version")) '\(version)' is not a semantic version") }
        variant = try r.string("variant")
        guard Fields.isName(variant) else { throw WireError("\(r.at("variant")) is not a name") }
        let ref = try BlobRef(reader: r)
        (self.path, sha256, size) = (ref.path, ref.sha256, ref.size)
        minMnnRuntime = try r.string("min_mnn_runtime")
        // At most 64 characters, the longest version any client compares (docs/protocol.md §3).
        guard Fields.length(minMnnRuntime) <= 64 else { throw WireError("\(r.at("min_mnn_runtime")) is longer than 64 characters") }
        guard Fields.isDottedVersion(minMnnRuntime) else { throw WireError("\(r.at("min_mnn_runtime")) is not a version like 3.6.1") }
        runtime = try RuntimeHints(try r.required("runtime"), r.at("runtime"))
        runtimeTrials = try r.optional("runtime_trials").map { (v) throws(WireError) in try RuntimeTrials(v, r.at("runtime_trials")) }
        runtimeHints = try r.optional("runtime_hints").map { (v) throws(WireError) in try HintRule.list(v, r.at("runtime_hints")) }
        contract = try r.optional("contract").map { (v) throws(WireError) in try IOContract(v, r.at("contract")) }
        requires = try r.optional("requires").map { (v) throws(WireError) in try Requirements(v, r.at("requires")) }
        probe = try r.optional("probe").map { (v) throws(WireError) in try BlobRef(v, r.at("probe")) }
        probeData = try r.optional("probe_data").map { (v) throws(WireError) in try BlobRef(v, r.at("probe_data")) }
        if probeData != nil, probe == nil { throw WireError("\(r.at("probe_data")) needs probe") }
        if let v = r.optional("peak_memory_mb") {
            let mb = try Reader.number(v, r.at("peak_memory_mb"))
            guard mb > 0, mb <= Fields.maxMemoryMB else {
                throw WireError("\(r.at("peak_memory_mb")) is \(mb), expected a number above 0 and at most 1048576 (MiB)")
            }
            peakMemoryMB = mb
        } else {
            peakMemoryMB = nil
        }
        if let list = try r.list("avoid_cpu") {
            guard (1...8).contains(list.count) else {
                throw WireError("\(r.at("avoid_cpu")) has \(list.count) names, expected 1 to 8")
            }
            var names: [String] = []
            for (i, item) in list.enumerated() {
                guard let s = item.stringValue, Fields.isCPUFeature(s) else {
                    throw WireError("\(r.at("avoid_cpu"))[\(i)] is not a CPU feature name: a lowercase letter or digit, then up to 31 lowercase letters, digits, '_' or '-'")
                }
                guard !names.contains(s) else { throw WireError("\(r.at("avoid_cpu")) names '\(s)' twice") }
                names.append(s)
            }
            avoidCPU = names
        } else {
            avoidCPU = nil
        }
        let own = try AppMetric.declarations(r.optional("metrics"), r.at("metrics"))
        if let outer {
            // The outer entry's metrics apply to its substitute, which declares none of its own.
            guard own == nil else { throw WireError("\(r.at("metrics")): an instead declares no app metrics (its entry's apply)") }
            metrics = outer
        } else {
            metrics = own
        }
        declaresMetrics = own != nil
        if let v = r.optional("instead") {
            let inner = try ModelEntry(v, r.at("instead"), insteadOf: .some(own))
            guard inner.instead == nil else {
                throw WireError("\(r.at("instead")) has an instead of its own (one level only)")
            }
            guard inner.version == version else {
                throw WireError("\(r.at("instead")) is version \(inner.version), the entry \(version): a substitute is another variant of the same release")
            }
            insteadStorage = [inner]
        } else {
            insteadStorage = []
        }
    }

    /// The artifact as a blob reference.
    public var blob: BlobRef { BlobRef(sha256: sha256, size: size) }

    /// Every blob the entry names: the artifact, its probe (and its data), its labels.
    public var blobs: [BlobRef] {
        var out = [blob]
        if let probe { out.append(probe) }
        if let probeData { out.append(probeData) }
        if let labels = contract?.labelsBlob { out.append(labels) }
        return out
    }
}

/// One release of a bundle: every member, one version.
public struct BundleEntry: Sendable, Equatable {
    public let version: String
    public let members: [String: ModelEntry]
    public let requires: Requirements?
    /// The app metrics the bundle declares (§3, "App metrics"); its members declare none.
    public let metrics: [String: AppMetric]?

    init(_ value: JSONValue, _ path: String) throws(WireError) {
        let r = try Reader(value, path)
        version = try r.string("version")
        guard SemVer(version) != nil else { throw WireError("\(r.at("version")) '\(version)' is not a semantic version") }
        guard let m = try r.required("members").objectValue else { throw WireError("\(r.at("members")) is not an object") }
        guard m.count >= 1 else { throw WireError("\(r.at("members")) is empty") }
        var members: [String: ModelEntry] = [:]
        for key in m.keys {
            guard Fields.isName(key) else { throw WireError("\(r.at("members")): '\(key)' is not a name") }
            let member = try ModelEntry(m[key]!, "\(r.at("members")).\(key)")
            guard !member.declaresMetrics else {
                throw WireError("\(r.at("members")).\(key).metrics: a bundle's app metrics are declared on the bundle entry, not on a member")
            }
            members[key] = member
        }
        self.members = members
        requires = try r.optional("requires").map { (v) throws(WireError) in try Requirements(v, r.at("requires")) }
        metrics = try AppMetric.declarations(r.optional("metrics"), r.at("metrics"))
    }

    private init(version: String, members: [String: ModelEntry], requires: Requirements?, metrics: [String: AppMetric]?) {
        self.version = version
        self.members = members
        self.requires = requires
        self.metrics = metrics
    }

    /// The same release with some members replaced (by their `instead`, fit rule (e)).
    func replacing(members chosen: [String: ModelEntry]) -> BundleEntry {
        BundleEntry(version: version, members: members.merging(chosen) { $1 }, requires: requires, metrics: metrics)
    }

    public var memberNames: [String] { members.keys.sorted() }
}

/// A manifest's stable or candidate: a model's entry, or a bundle's (it has `members`).
public enum Entry: Sendable, Equatable {
    case model(ModelEntry)
    case bundle(BundleEntry)

    init(_ value: JSONValue, _ path: String) throws(WireError) {
        if let o = value.objectValue, o["members"] != nil {
            self = .bundle(try BundleEntry(value, path))
        } else {
            self = .model(try ModelEntry(value, path))
        }
    }

    public var version: String {
        switch self {
        case .model(let m): return m.version
        case .bundle(let b): return b.version
        }
    }

    public var isBundle: Bool { if case .bundle = self { return true } else { return false } }

    /// The app metrics the release declares (a model's entry's, an instead's entry's, or the bundle's).
    public var metrics: [String: AppMetric]? {
        switch self {
        case .model(let m): return m.metrics
        case .bundle(let b): return b.metrics
        }
    }

    /// Members by name; a model entry is the one member named after the unit.
    public func members(unit: String) -> [String: ModelEntry] {
        switch self {
        case .model(let m): return [unit: m]
        case .bundle(let b): return b.members
        }
    }
}

/// The signed manifest of one model (or bundle) and tier (docs/protocol.md §3).
public struct Manifest: Sendable, Equatable {
    public let model: String
    public let tier: String
    public let sequence: Int64
    public let expires: Int64
    public let stable: Entry?
    public let candidate: Entry?
    public let percent: Double?
    public let salt: String?
    public let paused: Bool
    public let reportURL: String?

    init(payload: Data) throws(WireError) {
        let value: JSONValue
        do {
            value = try StrictJSON.parse(payload)
        } catch {
            throw WireError("manifest is not JSON: \(error.message)")
        }
        let r = try Reader(value, "manifest")
        guard r.object["schema_version"]?.intValue == 1 else { throw WireError("schema_version is not the integer 1") }
        model = try r.string("model")
        tier = try r.string("tier")
        guard Fields.isName(model) else { throw WireError("model is not a name") }
        guard Fields.isName(tier) else { throw WireError("tier is not a name") }
        sequence = try r.int("sequence", min: 1, max: Fields.maxSafeInteger)
        let expiresText = try r.string("expires")
        guard let t = WireTime.parse(expiresText) else {
            throw WireError("expires '\(expiresText)' is not a time like 2025-01-31T12:00:00Z")
        }
        expires = t
        stable = try r.optional("stable").map { (v) throws(WireError) in try Entry(v, "stable") }
        candidate = try r.optional("candidate").map { (v) throws(WireError) in try Entry(v, "candidate") }
        if let v = r.optional("percent") {
            let p = try Reader.number(v, "percent")
            guard let points = Percent.basisPoints(p), points > 0 else {
                throw WireError("percent must be greater than 0, at most 100, with at most two decimals")
            }
            percent = p
        } else {
            percent = nil
        }
        salt = try r.optionalString("salt")
        if let s = salt, !Fields.isSalt(s) { throw WireError("salt is not 8 to 64 lowercase hex") }
        paused = try r.bool("paused", default: false)
        reportURL = try r.optionalString("report_url")
        if let u = reportURL, !Fields.isReportURL(u) { throw WireError("report_url is not an http(s) URL or a relative path") }
        if candidate != nil {
            guard percent != nil, salt != nil else { throw WireError("a candidate needs percent and salt") }
        } else {
            guard percent == nil, salt == nil else { throw WireError("percent and salt may only be set with a candidate") }
            guard !paused else { throw WireError("paused may only be true during a rollout") }
        }
        if let s = stable, let c = candidate {
            guard s.isBundle == c.isBundle else { throw WireError("stable and candidate must both be bundle entries, or neither") }
            guard let sv = SemVer(s.version), let cv = SemVer(c.version), sv < cv else {
                throw WireError("candidate \(c.version) must be a higher version than stable \(s.version)")
            }
        }
    }

    public var isBundle: Bool { (stable ?? candidate)?.isBundle ?? false }
}
