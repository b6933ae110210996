// The Objective-C++ wrapper docs/guides/ios.md links to (its header is shown there): MNN's
// iOS framework is C++. Copy MNNModel.h and this file into the app, MNNModel.h in its bridging header.
// Not compiled here (no Apple SDK, no MNN iOS framework); excluded from the package's build.
#import "MNNModel.h"
#include <MNN/Interpreter.hpp>
#include <MNN/Tensor.hpp>
#include <vector>

NSErrorDomain const MNNModelErrorDomain = @"MNNModel";

static BOOL fail(NSError **error, MNNModelError code, NSString *what) {
    if (error) *error = [NSError errorWithDomain:MNNModelErrorDomain code:code userInfo:@{NSLocalizedDescriptionKey: what}];
    return NO;
}

static NSArray<NSNumber *> *shapeOf(const MNN::Tensor *t) {
    NSMutableArray<NSNumber *> *dims = [NSMutableArray array];
    for (int d : t->shape()) [dims addObject:@(d)];
    return dims;
}

@implementation MNNModel {
    std::shared_ptr<MNN::Interpreter> _net;
    MNN::Session *_session;
}
- (instancetype)initWithPath:(NSString *)path backend:(NSString *)backend threads:(int)threads
                   precision:(NSString *)precision error:(NSError **)error {
    if (!(self = [super init])) return nil;
    NSDictionary<NSString *, NSNumber *> *types = @{@"cpu": @(MNN_FORWARD_CPU), @"metal": @(MNN_FORWARD_METAL),
                                                    @"coreml": @(MNN_FORWARD_NN)};
    NSNumber *type = types[backend];
    if (!type) { fail(error, MNNModelErrorUnavailable, backend); return nil; }
    _net.reset(MNN::Interpreter::createFromFile(path.UTF8String), MNN::Interpreter::destroy);
    if (!_net) { fail(error, MNNModelErrorLoadFailed, path); return nil; }
    MNN::ScheduleConfig config;
    config.numThread = threads;
    config.type = (MNNForwardType)type.intValue;
    MNN::BackendConfig backendConfig;
    backendConfig.precision = [precision isEqualToString:@"low"] ? MNN::BackendConfig::Precision_Low
                            : [precision isEqualToString:@"high"] ? MNN::BackendConfig::Precision_High
                            : MNN::BackendConfig::Precision_Normal;
    config.backendConfig = &backendConfig;
    _session = _net->createSession(config);
    int used[2] = {-1, -1};
    if (!_session || (_net->getSessionInfo(_session, MNN::Interpreter::BACKENDS, used) && used[0] != type.intValue)) {
        fail(error, MNNModelErrorUnavailable, backend);                 // MNN fell back to the CPU
        return nil;
    }
    return self;
}
- (NSDictionary<NSString *, NSData *> *)run:(NSDictionary<NSString *, NSData *> *)inputs
                                     shapes:(NSDictionary<NSString *, NSArray<NSNumber *> *> *)shapes
                                    outputs:(NSArray<NSString *> *)outputs error:(NSError **)error {
    for (NSString *name in inputs) {
        MNN::Tensor *in = _net->getSessionInput(_session, name.UTF8String);
        if (!in) { fail(error, MNNModelErrorBadInput, name); return nil; }
        std::vector<int> dims;
        for (NSNumber *d in shapes[name]) dims.push_back(d.intValue);
        _net->resizeTensor(in, dims);
    }
    _net->resizeSession(_session);
    for (NSString *name in inputs) {
        MNN::Tensor *in = _net->getSessionInput(_session, name.UTF8String);
        MNN::Tensor host(in, MNN::Tensor::CAFFE);                       // C order, as the ONNX graph has it
        NSData *data = inputs[name];
        if ((int)data.length != host.size()) { fail(error, MNNModelErrorBadInput, name); return nil; }
        memcpy(host.host<uint8_t>(), data.bytes, data.length);
        in->copyFromHostTensor(&host);
    }
    _net->runSession(_session);
    NSMutableDictionary<NSString *, NSData *> *result = [NSMutableDictionary dictionary];
    for (NSString *name in outputs) {
        MNN::Tensor *out = _net->getSessionOutput(_session, name.UTF8String);
        if (!out) { fail(error, MNNModelErrorBadInput, name); return nil; }
        MNN::Tensor host(out, MNN::Tensor::CAFFE);
        out->copyToHostTensor(&host);
        NSMutableData *values = [NSMutableData dataWithLength:host.elementSize() * sizeof(float)];
        float *dst = (float *)values.mutableBytes;
        bool isInt = host.getType().code == halide_type_int;
        for (int i = 0; i < host.elementSize(); i++) dst[i] = isInt ? (float)host.host<int32_t>()[i] : host.host<float>()[i];
        result[name] = values;
    }
    return result;
}
- (NSArray<NSNumber *> *)outputShape:(NSString *)name {
    const MNN::Tensor *out = _net->getSessionOutput(_session, name.UTF8String);
    return out ? shapeOf(out) : @[];
}
- (NSDictionary<NSString *, NSArray<NSNumber *> *> *)inputShapes {
    NSMutableDictionary<NSString *, NSArray<NSNumber *> *> *shapes = [NSMutableDictionary dictionary];
    for (const auto &entry : _net->getSessionInputAll(_session)) shapes[@(entry.first.c_str())] = shapeOf(entry.second);
    return shapes;
}
@end
