#!/usr/bin/env bash
# The main job: OSMO's two-node torchrun tutorial, 2 nodes x 2 processes of DDP training on
# the bundled digits data, on the local pool; the final snapshot lands in a dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
ty=.venv/bin/trainyard
echo "== trainyard demo: examples/torchrun_multinode (2 nodes x 2 processes, local pool)"
start=$SECONDS
$ty workflow submit examples/torchrun_multinode/train.yaml --set n_gpus_per_node=2 --wait --logs
echo "   done in $((SECONDS - start)) s"
echo
$ty dataset info torchrun-multinode-model
echo
server=$($ty server status 2>/dev/null | sed -n 's/^trainyard server running at \([^ ]*\).*/\1/p' || true)
cat <<TEXT
What just happened: trainyard started a server in the background${server:+ at $server}
(state in ${TRAINYARD_HOME:-~/.local/share/trainyard}; it keeps its port across restarts), ran
the workflow's two tasks in sandboxes on the local pool, and uploaded the final snapshot
as the dataset 'torchrun-multinode-model' (latest version above).

Next (README.md, "Run your own script"):
  source .venv/bin/activate        # puts trainyard on PATH
  trainyard workflow list          # what ran
  trainyard dashboard              # opens the dashboard, already logged in
  trainyard dataset download torchrun-multinode-model ./model
  trainyard server stop            # when you are done
TEXT
