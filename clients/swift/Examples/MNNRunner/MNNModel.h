// The Objective-C++ wrapper of docs/guides/ios.md (the same text): MNN's iOS framework is C++.
// Not compiled here (no Apple SDK, no MNN iOS framework); excluded from the package's build.
#import <Foundation/Foundation.h>
NS_ASSUME_NONNULL_BEGIN
extern NSErrorDomain const MNNModelErrorDomain;
typedef NS_ERROR_ENUM(MNNModelErrorDomain, MNNModelError) {
    MNNModelErrorUnavailable = 1,   // this backend cannot run here: the self-test skips it
    MNNModelErrorLoadFailed = 2,
    MNNModelErrorBadInput = 3,
};
@interface MNNModel : NSObject
- (nullable instancetype)initWithPath:(NSString *)path backend:(NSString *)backend threads:(int)threads
                            precision:(NSString *)precision error:(NSError **)error;
/// Inputs by name (raw bytes, C order) reshaped to `shapes`; outputs by name as float32 bytes.
- (nullable NSDictionary<NSString *, NSData *> *)run:(NSDictionary<NSString *, NSData *> *)inputs
                                              shapes:(NSDictionary<NSString *, NSArray<NSNumber *> *> *)shapes
                                             outputs:(NSArray<NSString *> *)outputs
                                               error:(NSError **)error;
- (NSArray<NSNumber *> *)outputShape:(NSString *)name NS_SWIFT_NAME(outputShape(_:));
@property (readonly) NSDictionary<NSString *, NSArray<NSNumber *> *> *inputShapes;
@end
NS_ASSUME_NONNULL_END
