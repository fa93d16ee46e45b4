# SPDX-License-Identifier: Apache-2.0
# bench/peers.sh's plot: how many times faster mirror is than each peer, per measure (log scale).
set terminal pngcairo size 900,480 font ',10'
set output 'bench/results/peers.png'
set title 'mirror against TensorFlow MirroredStrategy and torch DDP (gloo), 2 replicas, one machine'
set ylabel "peer's time / mirror's (training: mirror's samples/s / peer's)"
set logscale y
set yrange [0.5:*]
set style data histograms
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set xtics noenhanced
set xlabel 'step: run + 1-float all-reduce (torch: dist.all_reduce); all-reduce per replica; Fashion-MNIST samples/s' noenhanced
set grid ytics
set key top right
plot 'bench/results/peers/plot.dat' using 2:xtic(1) title 'TF MirroredStrategy', '' using 3 title 'torch DDP gloo', 1 notitle lc 'black' dt 2
