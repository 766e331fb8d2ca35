# The PyTorch equivalent of idist_barrier, started by `python3 -m torch.distributed.run
# --nproc_per_node N`: join the gloo process group, one barrier, exit.
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
