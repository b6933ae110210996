import Foundation

/// A tensor as the model runner sees it: dtype, shape and little-endian bytes (C order).
public struct Tensor: Sendable, Equatable {
    public var dtype: String
    public var shape: [Int]
    public var data: Data

    public init(dtype: String, shape: [Int], data: Data) {
        self.dtype = dtype
        self.shape = shape
        self.data = data
    }

    static func itemSize(_ dtype: String) -> Int? {
        switch dtype {
        case "float32", "int32": return 4
        case "float16": return 2
        case "int8", "uint8", "bool": return 1
        case "int64": return 8
        default: return nil
        }
    }

    /// Zeros of a shape (a state input at a case's first step).
    public static func zeros(dtype: String, shape: [Int]) -> Tensor {
        let count = shape.reduce(1, *) * (itemSize(dtype) ?? 4)
        return Tensor(dtype: dtype, shape: shape, data: Data(count: max(0, count)))
    }

    /// The elements as doubles, flat; nil when the byte count does not fit the dtype.
    public func values() -> [Double]? {
        guard let size = Tensor.itemSize(dtype), data.count % size == 0 else { return nil }
        let bytes = [UInt8](data)
        let n = bytes.count / size
        var out = [Double]()
        out.reserveCapacity(n)
        func le(_ i: Int, _ k: Int) -> UInt64 {
            var v: UInt64 = 0
            for j in (0..<k).reversed() { v = v << 8 | UInt64(bytes[i * k + j]) }
            return v
        }
        for i in 0..<n {
            switch dtype {
            case "float32": out.append(Double(Float(bitPattern: UInt32(le(i, 4)))))
            case "float16": out.append(Tensor.half(UInt16(le(i, 2))))
            case "int8": out.append(Double(Int8(bitPattern: bytes[i])))
            case "uint8": out.append(Double(bytes[i]))
            case "bool": out.append(bytes[i] != 0 ? 1 : 0)
            case "int32": out.append(Double(Int32(bitPattern: UInt32(le(i, 4)))))
            default: out.append(Double(Int64(bitPattern: le(i, 8))))
            }
        }
        return out
    }

    static func half(_ bits: UInt16) -> Double {
        let sign: Double = bits & 0x8000 != 0 ? -1 : 1
        let exp = Int((bits >> 10) & 0x1F), frac = Double(bits & 0x3FF)
        if exp == 0 { return sign * frac * pow(2, -24) }
        if exp == 31 { return frac == 0 ? sign * .infinity : .nan }
        return sign * (1 + frac / 1024) * pow(2, Double(exp - 15))
    }
}

/// The golden probe of one variant (docs/protocol.md §11).
public struct GoldenProbe: Sendable {
    /// The largest probe data blob a client holds: an entry declaring more is refused before download.
    public static let maxDataBytes: Int64 = 128 * 1024 * 1024

    public struct NamedTensor: Sendable {
        public let name: String
        public let tensor: Tensor
    }

    public struct Step: Sendable {
        public let inputs: [NamedTensor]
        public let expected: [NamedTensor]
    }

    public let model: String
    public let variant: String
    public let artifactSHA256: String
    public let state: [(input: String, output: String)]
    public let cases: [[Step]]
    public let minCosine: Double
    public let maxAbsError: Double

    /// Parses a probe blob (already checked against its size and digest); unknown keys
    /// are ignored at every level, known keys read strictly (docs/protocol.md §11).
    /// `dataSHA256` is the entry's `probe_data` (nil: none) and `tensorData` its verified
    /// bytes, which the tensors' offsets read.
    init(data: Data, artifactSHA256 expectedArtifact: String, dataSHA256: String? = nil, tensorData: Data? = nil) throws(WireError) {
        let value: JSONValue
        do {
            value = try StrictJSON.parse(data)
        } catch {
            throw WireError("golden probe is not JSON: \(error.message)")
        }
        let r = try Reader(value, "probe")
        guard r.object["schema_version"]?.intValue == 1 else { throw WireError("probe schema_version is not the integer 1") }
        model = try r.string("model")
        variant = try r.string("variant")
        artifactSHA256 = try r.string("artifact_sha256")
        guard Fields.isName(model), Fields.isName(variant), Fields.isSha256(artifactSHA256) else {
            throw WireError("probe model, variant or artifact_sha256 is not valid")
        }
        guard artifactSHA256 == expectedArtifact else {
            throw WireError("probe is for artifact \(artifactSHA256.prefix(12)), the entry's is \(expectedArtifact.prefix(12))")
        }
        var pairs: [(String, String)] = []
        if let list = r.object["state"] {
            guard let items = list.arrayValue else { throw WireError("probe state is not a list") }
            for item in items {
                guard let pair = item.arrayValue, pair.count == 2, let a = pair[0].stringValue, let b = pair[1].stringValue else {
                    throw WireError("probe state holds a non-pair")
                }
                pairs.append((a, b))
            }
        }
        state = pairs
        let named = try r.optionalString("data_sha256")
        guard named == dataSHA256 else {
            throw WireError(named == nil ? "the entry names a probe data blob, the probe does not"
                            : "probe data_sha256 \(named!.prefix(12)) is not the entry's probe_data (\(dataSHA256?.prefix(12) ?? "none"))")
        }
        let blob: Data? = named == nil ? nil : (tensorData ?? Data())
        func tensors(_ v: JSONValue, _ path: String) throws(WireError) -> [NamedTensor] {
            guard let list = v.arrayValue, !list.isEmpty else { throw WireError("\(path) is not a non-empty list") }
            var out: [NamedTensor] = []
            for (i, item) in list.enumerated() { out.append(try GoldenProbe.tensor(item, "\(path)[\(i)]", blob: blob)) }
            guard Set(out.map(\.name)).count == out.count else { throw WireError("\(path): tensor names repeat") }
            return out
        }
        var cases: [[Step]] = []
        let caseList = try r.requiredList("cases")
        guard !caseList.isEmpty else { throw WireError("probe has no cases") }
        for (ci, c) in caseList.enumerated() {
            let cr = try Reader(c, "cases[\(ci)]")
            let stepList = try cr.requiredList("steps")
            guard !stepList.isEmpty else { throw WireError("\(cr.at("steps")) is empty") }
            var steps: [Step] = []
            for (si, s) in stepList.enumerated() {
                let sr = try Reader(s, "\(cr.at("steps"))[\(si)]")
                steps.append(Step(inputs: try tensors(try sr.required("inputs"), sr.at("inputs")),
                                  expected: try tensors(try sr.required("expected"), sr.at("expected"))))
            }
            cases.append(steps)
        }
        self.cases = cases
        let tol = try Reader(try r.required("tolerance"), "tolerance")
        minCosine = try Reader.number(try tol.required("min_cosine"), "tolerance.min_cosine")
        maxAbsError = try Reader.number(try tol.required("max_abs_error"), "tolerance.max_abs_error")
        guard minCosine >= -1, minCosine <= 1, maxAbsError >= 0 else { throw WireError("probe tolerance out of range") }
    }

    /// A tensor in the probe's encoding: name, dtype, shape, canonical base64 of exactly its bytes,
    /// or its `offset` in `blob` (the probe data blob; nil when the probe names none).
    static func tensor(_ item: JSONValue, _ path: String, blob: Data? = nil) throws(WireError) -> NamedTensor {
        let tr = try Reader(item, path)
        let name = try TensorSpec.tensorName(tr, "name")
        guard let dtype = try tr.oneOf("dtype", TensorSpec.dtypes) else { throw WireError("\(tr.at("dtype")) missing") }
        var shape: [Int] = []
        for dim in try tr.requiredList("shape") {
            guard let d = dim.intValue, d >= 0, d < Int64(Int32.max) else { throw WireError("\(tr.at("shape")) holds a bad size") }
            shape.append(Int(d))
        }
        let count = shape.reduce(1) { $0.multipliedReportingOverflow(by: $1).overflow ? Int.max / 16 : $0 * $1 }
        let text = try tr.optionalString("data")
        let at = tr.optional("offset")
        guard (text == nil) != (at == nil) else { throw WireError("\(path) has exactly one of data and offset") }
        if let at {
            let offset = try Reader.int(at, tr.at("offset"), min: 0, max: Fields.maxSafeInteger)
            guard let blob else { throw WireError("\(tr.at("offset")): the probe names no data_sha256") }
            let end = Int64(count) * Int64(Tensor.itemSize(dtype)!) + offset
            guard end <= Int64(blob.count) else {
                throw WireError("\(path): bytes \(offset) to \(end) lie beyond the \(blob.count)-byte probe data blob")
            }
            let start = blob.startIndex + Int(offset)
            return NamedTensor(name: name, tensor: Tensor(dtype: dtype, shape: shape, data: Data(blob[start..<(start + Int(end - offset))])))
        }
        guard let raw = Base64.decodeCanonical(text!) else {
            throw WireError("\(tr.at("data")) is not canonical base64")
        }
        guard raw.count == count * Tensor.itemSize(dtype)! else {
            throw WireError("\(tr.at("data")): \(raw.count) bytes for shape \(shape) of \(dtype)")
        }
        return NamedTensor(name: name, tensor: Tensor(dtype: dtype, shape: shape, data: raw))
    }

    /// The first failure's code and where, or nil when every case passes (§11, "The check").
    func check(_ computed: [[[String: Tensor]]]) -> (code: String, detail: String)? {
        guard computed.count == cases.count else {
            return ("count-mismatch", "\(computed.count) cases computed, \(cases.count) in the probe")
        }
        for (ci, steps) in cases.enumerated() {
            guard computed[ci].count == steps.count else { return ("count-mismatch", "case \(ci + 1): steps differ") }
            for (si, step) in steps.enumerated() {
                if let miss = check(step: step, outputs: computed[ci][si], where: "case \(ci + 1) step \(si + 1)") { return miss }
            }
        }
        return nil
    }

    /// The first failure of one step's outputs, or nil.
    func check(step: Step, outputs: [String: Tensor], where prefix: String) -> (code: String, detail: String)? {
        for expected in step.expected {
            let at = "\(prefix) output \(expected.name)"
            guard let got = outputs[expected.name] else { return ("missing-output", at) }
            guard got.shape == expected.tensor.shape else {
                return ("shape-mismatch", "\(at): shape \(got.shape), expected \(expected.tensor.shape)")
            }
            guard let want = expected.tensor.values(), let have = got.values(), have.count == want.count else {
                return ("shape-mismatch", "\(at): element count differs")
            }
            if want.contains(where: { !$0.isFinite }) || have.contains(where: { !$0.isFinite }) { return ("not-finite", at) }
            var dot = 0.0, na = 0.0, nb = 0.0, worst = 0.0
            for (x, y) in zip(have, want) {
                dot += x * y
                na += x * x
                nb += y * y
                worst = max(worst, abs(x - y))
            }
            let ra = na.squareRoot(), rb = nb.squareRoot()
            let cosine = (ra == 0 && rb == 0) ? 1.0 : ((ra == 0 || rb == 0) ? 0.0 : dot / (ra * rb))
            if cosine < minCosine { return ("cosine", "\(at): cosine \(cosine) < \(minCosine)") }
            if worst > maxAbsError { return ("abs-error", "\(at): abs error \(worst) > \(maxAbsError)") }
        }
        return nil
    }
}

extension Reader {
    /// Refuses keys outside `keys` (documents other than the manifest are read strictly).
    func only(_ keys: Set<String>) throws(WireError) {
        for key in object.keys where !keys.contains(key) { throw WireError("\(at(key)): unknown key") }
    }
}
