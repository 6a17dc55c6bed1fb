# call 1b: the GGUF's second chunk of three
python3 benchmarks/bundle.py add .carry/G3/bundle-*-2of3 || exit 1
tail -n 5 /tmp/mini/lease.log
