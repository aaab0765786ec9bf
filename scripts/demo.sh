#!/usr/bin/env bash
# The main job: OSMO's two-node torchrun tutorial, 2 nodes x 2 processes of DDP training on
# the bundled digits data, on the local pool; the final snapshot lands in a dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
ty=.venv/bin/trainyard
echo "== trainyard demo: examples/torchrun_multinode (2 nodes x 2 processes, local pool)"
$ty workflow submit examples/torchrun_multinode/train.yaml --set n_gpus_per_node=2 --wait --logs
echo
$ty dataset info torchrun-multinode-model
echo
echo "The snapshot is the dataset 'torchrun-multinode-model' (latest version above)."
echo "Fetch it with: $ty dataset download torchrun-multinode-model ./model"
