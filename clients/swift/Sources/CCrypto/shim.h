// OpenSSL's libcrypto for SHA-256 on Linux: its assembly uses the CPU's SHA extensions
// (x86 SHA-NI, ARMv8 crypto), several times libsodium's portable C. The SHA256_* calls
// are deprecated in OpenSSL 3 in favour of EVP, but they keep the context a plain struct
// (a Swift value) and skip EVP's provider lookup; they stay in every 3.x release.
#define OPENSSL_SUPPRESS_DEPRECATED 1
#include <openssl/sha.h>
