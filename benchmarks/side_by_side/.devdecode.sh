set -u
g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/decode_timer.cpp -o /tmp/dt || exit 1
lscpu | grep -E "Model name|L3|NUMA node0"
for shape in "8 4096" "8 16384" "1 32768"; do
 for t in 2 16; do
  pin=""; [ "$t" -lt "$(nproc)" ] && pin="taskset -c 0-$((t-1))"
  for dt in fp32 bf16 int8 fp8; do
   for L in token head; do LAYOUT=$L $pin /tmp/dt $shape 32 8 128 $t 7 $dt; done
  done
  for dt in fp32 bf16; do OMP_NUM_THREADS=$t $pin python3 benchmarks/side_by_side/torch_sdpa_decode.py $shape 32 8 128 $t 7 $dt; done
 done
done 2>&1 | tee $OUT/decode_baseline.txt
