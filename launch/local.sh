#!/usr/bin/env bash
# Any headspec command, a pipeline or a sweep on this machine (thin wrapper over headspec/launch/).
#   launch/local.sh -- train --config=configs/base_decoder.py --workdir=runs/decoder
#   launch/local.sh --pipeline --config=configs/quickstart.py --workdir=runs/pipeline
#   launch/local.sh --processes=2 -- train ...          # two jax.distributed processes on this machine
# Add --dry-run to print the commands and start nothing.
exec python -m headspec.launch local "$@"
