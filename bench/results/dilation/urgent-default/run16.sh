set -x
cd /work/main
B="build/bin/poseidon bench --models vgg19 --systems poseidon-overlap --nodes 16 --rates 30 --iterations 4 --warmup 2 --run-timeout 400 --repeat 3 --machine-rates 83,26.4,1.77 --time-dilation 2"
for r in a b; do
  $B --json /tmp/u/16-none-$r.json > /tmp/u/16-none-$r.log 2>&1
  $B --urgent-layers 3 --json /tmp/u/16-u3fifo-$r.json > /tmp/u/16-u3fifo-$r.log 2>&1
done
