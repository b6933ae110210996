// iOS only (excluded from the package's build: MNNModel is the app's Objective-C++ class,
// MNNModel.h in its bridging header). The client is given `runner: MNNRunner.mnn`.
import EdgeReg
import Foundation

extension MNNModel: MNNNet {}

extension MNNRunner {
    static let mnn = MNNRunner(
        open: { path, backend, threads, precision in
            try MNNModel(path: path, backend: backend, threads: threads, precision: precision)
        },
        isUnavailable: { error in
            do { throw error } catch MNNModelError.unavailable { return true } catch { return false }
        })
}
