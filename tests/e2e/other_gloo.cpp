// A second copy of gloo's CreateDevice, as PyTorch's wheels export theirs: a program that loads
// it before libgloo.so.0 (other_gloo_check links it first) has its gloo calls resolved here.
#include <gloo/transport/tcp/device.h>

namespace gloo::transport::tcp {
std::shared_ptr<::gloo::transport::Device> CreateDevice(const struct attr&) { return nullptr; }
}  // namespace gloo::transport::tcp
