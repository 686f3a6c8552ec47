#!/usr/bin/env bash
# SLURM: writes slurm/JOB_NAME.sbatch (srun on every node, SIGTERM-checkpoint-requeue before the time
# limit, sweeps as a job array) and submits it.
#   launch/slurm.sh --nodes=2 --gpus-per-node=4 --pipeline --config=configs/base_encoder.py --workdir=/shared/runs/enc
#   launch/slurm.sh --nodes=1 --gpus-per-node=8 --grid=train.regularizers.drophead=0,0.1,0.2 --seeds=0,1,2 \
#       --config=configs/base_decoder.py --workdir=/shared/runs/drophead
exec python -m headspec.launch slurm "$@"
