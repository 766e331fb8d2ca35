#pragma once
// What auto_dataloader tells auto_model about the batch a rank trains on: where the world size
// does not divide the global batch, rank r's share n_r of a global batch of N is weighed
// n_r x world / N before auto_model's AVG all_reduce, so that the average is the global batch's
// mean (sum of n_r / N x rank r's mean) and not the mean of unequal shares' means. 1 otherwise.
// Set by the sampler as it hands out each batch, read when a bucket's all_reduce starts.

namespace idist::detail {

void set_batch_weight(double weight);
double batch_weight();

}  // namespace idist::detail
