#!/usr/bin/env bash
# Train on this machine (CPU, or every local GPU/TPU chip: data-parallel over all local devices).
#   launch/local.sh configs/base_decoder.py runs/decoder [--config.key=value ...]
set -euo pipefail
config=${1:?config file}; workdir=${2:?workdir}; shift 2
: "${HEADSPEC_DATA_DIR:?set HEADSPEC_DATA_DIR to the folder holding text/ and ud/}"
exec headspec train --config="$config" --workdir="$workdir" "$@"
