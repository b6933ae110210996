// The self-test's model runner over MNN for iOS (docs/guides/ios.md, "The model runner over
// MNN"), with MNN behind a protocol: on iOS the Objective-C++ `MNNModel` beside this file
// (MNNModel.h/.mm, over MNN::Interpreter) conforms as Swift imports it, in
// MNNModel+MNNNet.swift. This file is a target of the package (MNNRunnerExample, in no
// product), so `swift build`/`swift test` type-check it on Linux against the real ModelRunner
// and ModelSession protocols in Swift 6 mode; the Objective-C++ and the conformance need the
// Apple SDK and MNN's iOS framework, which this machine lacks, and are excluded from it.
import EdgeReg
import Foundation

/// One loaded MNN model, as the runner calls it (MNNModel.h's methods, as Swift imports them).
public protocol MNNNet: AnyObject {
    /// Inputs by name (raw bytes, C order) reshaped to `shapes`; outputs by name as float32 bytes.
    func run(_ inputs: [String: Data], shapes: [String: [NSNumber]], outputs: [String]) throws -> [String: Data]
    func outputShape(_ name: String) -> [NSNumber]
    var inputShapes: [String: [NSNumber]] { get }
}

/// Loads models through the app's MNN: `open` makes one on a backend (MNNModel's initializer),
/// `isUnavailable` says which of its errors mean "this backend cannot run here" (the self-test
/// skips the backend) rather than a failure (the backend counts as failing).
public struct MNNRunner: ModelRunner {
    public typealias Open = @Sendable (_ path: String, _ backend: String, _ threads: Int32, _ precision: String) throws -> any MNNNet

    private let open: Open
    private let isUnavailable: @Sendable (any Error) -> Bool

    public init(open: @escaping Open, isUnavailable: @escaping @Sendable (any Error) -> Bool) {
        self.open = open
        self.isUnavailable = isUnavailable
    }

    public func load(model: URL, backend: String, threads: Int, precision: String, outputs: [String]) async throws -> any ModelSession {
        let net: any MNNNet
        do {
            net = try open(model.path, backend, Int32(clamping: threads), precision)
        } catch where isUnavailable(error) {
            throw BackendUnavailable("MNN cannot create \(backend) here: \(error)")
        }
        return MNNSession(net: net, outputs: outputs)
    }
}

/// @unchecked: an MNN session is not thread-safe; the lock keeps one call at a time.
public final class MNNSession: ModelSession, @unchecked Sendable {
    private let net: any MNNNet
    private let outputs: [String]
    private let lock = NSLock()

    init(net: any MNNNet, outputs: [String]) {
        self.net = net
        self.outputs = outputs
    }

    public func run(_ inputs: [String: Tensor]) async throws -> [String: Tensor] {
        try runLocked(inputs.mapValues(int32IfInt64))
    }

    private func runLocked(_ fed: [String: Tensor]) throws -> [String: Tensor] {
        lock.lock()
        defer { lock.unlock() }
        let raw = try net.run(
            fed.mapValues { $0.data }, shapes: fed.mapValues { $0.shape.map { NSNumber(value: $0) } }, outputs: outputs)
        var result: [String: Tensor] = [:]
        for (name, data) in raw {
            // C order in the model's own layout (NCHW): the probe compares element by element.
            result[name] = Tensor(dtype: "float32", shape: net.outputShape(name).map { $0.intValue }, data: data)
        }
        return result
    }

    public var inputShapes: [String: [Int]] {
        lock.lock()
        defer { lock.unlock() }
        return net.inputShapes.mapValues { $0.map { $0.intValue } }
    }

    public func close() async {}
}

/// MNN takes int64 graph inputs (token ids, a sample rate) as int32.
public func int32IfInt64(_ t: Tensor) -> Tensor {
    guard t.dtype == "int64", let values = t.values() else { return t }
    var data = Data(capacity: values.count * 4)
    for v in values { withUnsafeBytes(of: Int32(v).littleEndian) { data.append(contentsOf: $0) } }
    return Tensor(dtype: "int32", shape: t.shape, data: data)
}
