# lease F, call 1b: the GGUF's second chunk of three, and lease E's adapter into the run folder the daemon benches
python3 benchmarks/bundle.py add .carry/G3/bundle-*-2of3 || exit 1
mkdir -p /tmp/mini/rl/recipe/final.part && cp .carry/S17/adapter/* /tmp/mini/rl/recipe/final.part/ && mv /tmp/mini/rl/recipe/final.part /tmp/mini/rl/recipe/final
sha256sum /tmp/mini/rl/recipe/final/adapter_model.safetensors; tail -n 5 /tmp/mini/lease.log
