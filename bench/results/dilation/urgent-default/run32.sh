set -x
cd /work/main
B="build/bin/poseidon bench --models vgg19 --systems poseidon-overlap --nodes 32 --rates 30 --iterations 4 --warmup 2 --run-timeout 400 --repeat 3 --machine-rates 83,26.4,1.77 --time-dilation 4"
for r in a b; do
  $B --json /tmp/u/32-auto-$r.json > /tmp/u/32-auto-$r.log 2>&1
  $B --urgent-layers 0 --json /tmp/u/32-none-$r.json > /tmp/u/32-none-$r.log 2>&1
done
