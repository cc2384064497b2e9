#!/usr/bin/env bash
# The full benchmark sweep behind bench/results/ (about 250 minutes here; run as root).
#   stage A: vgg19, every system, 1/2/4/8 nodes, 1000/300/100/30 Mbit/s, and the bisection of the
#            minimum link rate for 90% efficiency at 8 nodes for poseidon and ddp;
#   stage B: the other zoo models against DDP at 1 and 8 nodes, 300/100/30 Mbit/s;
#   stage C: what the lossy DDP variants do to real training (bench/powersgd_loss.py, ~12 min);
#   stage D: the fair bench (issue 13 item 0): vgg19 and googlenet with the runtime's own work charged at
#            full width on a Titan X and on one CPU core, scaled and tuned DDP buckets, 3 runs per point
#            (~30 min);
#   stage E: priority-scheduled links and the overlapped forward (issue 14, docs/scheduling.md):
#            resnet-152 and alexnet, 3 runs per point (~40 min);
#   stage F: the 16-bit wire against DDP's fp16 hook (issue 14 item 2, docs/wire.md): every zoo model
#            once (~17 min), the three where the link matters 3 runs per point (~20 min), and the main
#            job's accuracy with each wire (~15 min);
#   stage G: scale (issue 13): vgg19, vgg19-22k, googlenet, resnet-152 at 1-32 nodes, 100 and 30 Mbit/s,
#            poseidon and ddp (and poseidon-overlap for vgg19), one run each, 4 iterations (~30 min), then
#            bench/scale_report.py: the planner's prediction of every point, to 256 nodes, and the plots.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results
mkdir -p "$out/plots"
bin=build/bin/poseidon
a=(bench --models vgg19 --systems poseidon,ps-wfbp,ps-naive,adam,ddp,ddp-fp16,ddp-powersgd1,ddp-powersgd4
   --nodes 1,2,4,8 --rates 1000,300,100,30 --bisect poseidon,ddp
   --json "$out/vgg19.json" --markdown "$out/vgg19.md" --plots "$out/plots")
b=(bench --models vgg19-22k,googlenet,resnet-152,alexnet --systems poseidon,ps-wfbp,ddp,ddp-fp16
   --nodes 1,8 --rates 300,100,30
   --json "$out/models.json" --markdown "$out/models.md" --plots "$out/plots")
d=(bench --models vgg19,googlenet --systems poseidon,ddp,ddp-tuned,ddp-fp16 --nodes 1,8 --rates 100,30
   --repeat 3 --compute titanx,cpu:1 --json "$out/fair.json" --markdown "$out/fair.md" --plots "$out/plots/fair")
e=(bench --models resnet-152,alexnet --systems poseidon,poseidon-overlap,ddp,ddp-fp16 --nodes 1,8 --rates 30,100
   --repeat 3 --trace "$out/traces" --json "$out/overlap.json" --markdown "$out/overlap.md"
   --plots "$out/plots/overlap")
f1=(bench --models vgg19,vgg19-22k,googlenet,inception-v3,resnet-152,alexnet
    --systems poseidon-overlap,poseidon-bf16,poseidon-overlap-bf16,ddp-fp16 --nodes 8 --rates 30,100
    --json "$out/wire-zoo.json" --markdown "$out/wire-zoo.md")
f2=(bench --models resnet-152,alexnet,googlenet --systems poseidon-bf16,poseidon-overlap-bf16,ddp-fp16
    --nodes 8 --rates 30,100 --repeat 3 --json "$out/wire.json" --markdown "$out/wire.md")
g=(--nodes 1,2,4,8,16,32 --rates 100,30 --iterations 4 --warmup 2 --run-timeout 400 --tcp-rcvbuf 16384)
{
  echo "# made by bench/run_full.sh on $(date -u +%Y-%m-%d) ($(nproc) cores, $(uname -r))"
  echo "build/bin/poseidon ${a[*]}"
  echo "build/bin/poseidon ${b[*]}"
  echo "build/bin/poseidon ${d[*]}"
  echo "build/bin/poseidon ${e[*]}"
  echo "build/bin/poseidon ${f1[*]}"
  echo "build/bin/poseidon ${f2[*]}"
  echo "for w in fp32 bf16 fp16; do build/bin/poseidon train --wire \$w --summary $out/wire-accuracy-\$w.json; done"
  echo "build/bin/poseidon bench --models vgg19 --systems poseidon,poseidon-overlap,ddp ${g[*]} --json $out/scale/vgg19.json"
  echo "build/bin/poseidon bench --models M --systems poseidon,ddp ${g[*]} --json $out/scale/M.json  (M: resnet-152, googlenet, vgg19-22k)"
  echo "/usr/bin/python3 bench/scale_report.py $out/scale/{vgg19,vgg19-22k,googlenet,resnet-152}.json --markdown $out/scale.md --plots $out/plots/scale"
  echo "for w in fp32 bf16; do build/bin/poseidon train --seed 2 --wire \$w --summary $out/wire-accuracy-\$w-s2.json; done"
  echo "/usr/bin/python3 bench/powersgd_loss.py"
  echo "/usr/bin/python3 bench/powersgd_loss.py --lr 0.01 --json $out/powersgd_loss_lr0.01.json --markdown $out/powersgd_loss_lr0.01.md"
} > "$out/command.txt"
"$bin" "${a[@]}" | tee "$out/vgg19.log"
"$bin" "${b[@]}" | tee "$out/models.log"
mkdir -p "$out/plots/fair"
"$bin" "${d[@]}" | tee "$out/fair.log"
mkdir -p "$out/plots/overlap" "$out/plots/scheduling"
"$bin" "${e[@]}" | tee "$out/overlap.log"
for m in resnet-152 alexnet; do  # one iteration before and after (docs/scheduling.md)
  /usr/bin/python3 bench/trace_timeline.py "$(ls "$out"/traces/$m-poseidon-8n-30mbit-*.json | head -1)" --iteration 6 \
    --out "$out/plots/scheduling/$m-30mbit-barrier.png"
  /usr/bin/python3 bench/trace_timeline.py "$(ls "$out"/traces/$m-poseidon-overlap-8n-30mbit-*.json | head -1)" \
    --iteration 6 --out "$out/plots/scheduling/$m-30mbit-overlap.png"
done
rm -rf "$out/traces"
"$bin" "${f1[@]}" | tee "$out/wire-zoo.log"
"$bin" "${f2[@]}" | tee "$out/wire.log"
for w in fp32 bf16 fp16; do
  "$bin" train --wire "$w" --summary "$out/wire-accuracy-$w.json" --quiet
done
for w in fp32 bf16; do
  "$bin" train --seed 2 --wire "$w" --summary "$out/wire-accuracy-$w-s2.json" --quiet
done
rm -f "$out"/plots/*.dat "$out"/plots/*.gp "$out"/plots/fair/*.dat "$out"/plots/fair/*.gp "$out"/plots/overlap/*.dat \
  "$out"/plots/overlap/*.gp
/usr/bin/python3 bench/powersgd_loss.py
/usr/bin/python3 bench/powersgd_loss.py --lr 0.01 --json "$out/powersgd_loss_lr0.01.json" --markdown "$out/powersgd_loss_lr0.01.md"
mkdir -p "$out/scale" "$out/plots/scale"
"$bin" bench --models vgg19 --systems poseidon,poseidon-overlap,ddp "${g[@]}" --json "$out/scale/vgg19.json" \
  --markdown "$out/scale/vgg19.md" | tee "$out/scale/vgg19.log"
for m in resnet-152 googlenet vgg19-22k; do
  "$bin" bench --models "$m" --systems poseidon,ddp "${g[@]}" --json "$out/scale/$m.json" --markdown "$out/scale/$m.md" |
    tee "$out/scale/$m.log"
done
/usr/bin/python3 bench/scale_report.py "$out"/scale/{vgg19,vgg19-22k,googlenet,resnet-152}.json --cli "$bin" \
  --markdown "$out/scale.md" --plots "$out/plots/scale"
