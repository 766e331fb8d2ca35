"""ignite.distributed's SLURM consistency rule, mirrored so that tests need no ignite.

PyTorch-Ignite 0.4.13, ignite/distributed/comp_models/native.py: when SLURM_JOB_ID is set,
_NativeDistModel.setup_env_vars calls _setup_env_in_slurm, which requires the variables in
REQUIRED and then _setup_ddp_vars_from_slurm_env: when RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT are all set, then on more than one node (SLURM_JOB_NUM_NODES)
each of RANK, LOCAL_RANK, WORLD_SIZE must equal SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS;
on one node each must be at least its SLURM value. _identify_local_rank then takes
LOCAL_RANK from SLURM_LOCALID. Lightning's SLURMEnvironment reads the same SLURM variables.

Prints one line, "rank R: ignite's SLURM rule: ok ..." or "... refused: <ignite's message>",
and exits 0 or 1 accordingly."""
import os
import sys

REQUIRED = ["SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_NODELIST",
            "SLURM_JOB_NUM_NODES"]


def check(environ):
    """ignite's verdict: None when it would go on, else the message of its RuntimeError."""
    for key in REQUIRED:
        if key not in environ:
            return f"SLURM distributed configuration is missing '{key}' in env variables"
    slurm = {"RANK": int(environ["SLURM_PROCID"]), "LOCAL_RANK": int(environ["SLURM_LOCALID"]),
             "WORLD_SIZE": int(environ["SLURM_NTASKS"])}
    pth_keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    if not all(k in environ for k in pth_keys):
        return None  # ignite then derives everything from SLURM (and warns when some are set)
    multi_node = int(environ["SLURM_JOB_NUM_NODES"]) > 1
    for key, slurm_value in slurm.items():
        pth_value = int(environ[key])
        if multi_node and pth_value != slurm_value:
            return ("Environment variable defined for PyTorch Distributed context is inconsistent with "
                    f"equivalent SLURM env variable. {key}: {pth_value} vs {slurm_value}")
        if not multi_node and pth_value < slurm_value:
            return ("Environment variable defined for PyTorch Distributed context is inconsistent with "
                    f"equivalent SLURM env variable. We expect that {key}: {pth_value} >= {slurm_value}")
    return None


def main():
    error = check(os.environ)
    rank = os.environ.get("RANK", "?")
    if error:
        print(f"rank {rank}: ignite's SLURM rule: refused: {error}", flush=True)
        sys.exit(1)
    # What ignite then uses: LOCAL_RANK from SLURM_LOCALID, the rest from the env contract.
    print(f"rank {rank}: ignite's SLURM rule: ok, local rank {os.environ['SLURM_LOCALID']} of world "
          f"{os.environ['WORLD_SIZE']}", flush=True)


if __name__ == "__main__":
    main()
