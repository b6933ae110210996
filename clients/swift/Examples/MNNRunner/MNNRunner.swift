// docs/guides/ios.md's model runner over MNN (the same code): MNN behind a protocol, MNNNet,
// which the Objective-C++ MNNModel beside this file meets as Swift imports it
// (MNNModel+MNNNet.swift). The package's MNNRunnerExample target, in no product: `swift build`
// and `swift test` type-check it on Linux against the real ModelRunner and ModelSession in
// Swift 6 mode. The Objective-C++ and that conformance need the Apple SDK and MNN's iOS
// framework, which this machine lacks: excluded from the target.
import EdgeReg
import Foundation

protocol MNNNet: AnyObject {  // MNNModel.h as Swift imports it
    func run(_ inputs: [String: Data], shapes: [String: [NSNumber]], outputs: [String]) throws -> [String: Data]
    func outputShape(_ name: String) -> [NSNumber]
    var inputShapes: [String: [NSNumber]] { get }
}

struct MNNRunner: ModelRunner {
    /// Makes one model on a backend (MNNModel's initializer).
    let open: @Sendable (_ path: String, _ backend: String, _ threads: Int32, _ precision: String) throws -> any MNNNet
    /// Which of open's errors mean "no such backend here": skipped, not counted as failing.
    let isUnavailable: @Sendable (any Error) -> Bool

    func load(model: URL, backend: String, threads: Int, precision: String, outputs: [String]) async throws -> any ModelSession {
        let net: any MNNNet
        do {
            net = try open(model.path, backend, Int32(clamping: threads), precision)
        } catch where isUnavailable(error) {
            throw BackendUnavailable("MNN cannot create \(backend) here: \(error)")
        }
        return MNNSession(net: net, outputs: outputs)
    }
}

// @unchecked: an MNN session is not thread-safe; the lock keeps one call at a time.
final class MNNSession: ModelSession, @unchecked Sendable {
    private let net: any MNNNet
    private let outputs: [String]
    private let lock = NSLock()
    init(net: any MNNNet, outputs: [String]) { self.net = net; self.outputs = outputs }

    func run(_ inputs: [String: Tensor]) async throws -> [String: Tensor] {
        try runLocked(inputs.mapValues(int32IfInt64))
    }

    private func runLocked(_ fed: [String: Tensor]) throws -> [String: Tensor] {
        lock.lock()
        defer { lock.unlock() }
        let raw = try net.run(fed.mapValues { $0.data }, shapes: fed.mapValues { $0.shape.map { NSNumber(value: $0) } }, outputs: outputs)
        // C order in the model's own layout (NCHW): the probe compares element by element.
        return raw.reduce(into: [:]) { result, output in
            result[output.key] = Tensor(dtype: "float32", shape: net.outputShape(output.key).map { $0.intValue }, data: output.value)
        }
    }

    var inputShapes: [String: [Int]] {
        lock.lock()
        defer { lock.unlock() }
        return net.inputShapes.mapValues { $0.map { $0.intValue } }
    }

    func close() async {}
}

/// MNN takes int64 graph inputs (token ids, a sample rate) as int32.
func int32IfInt64(_ t: Tensor) -> Tensor {
    guard t.dtype == "int64", let values = t.values() else { return t }
    var data = Data(capacity: values.count * 4)
    for v in values { withUnsafeBytes(of: Int32(v).littleEndian) { data.append(contentsOf: $0) } }
    return Tensor(dtype: "int32", shape: t.shape, data: data)
}
