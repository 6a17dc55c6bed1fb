# call 1: the tree to /tmp/repo, the wheels, the GGUF's first chunk of three, then the daemon; $1: the lease script,
# $2: the epoch second to pack by, $3: GPUs (the tree grew: two chunks and the tree no longer fit one call's 64 MiB)
mkdir -p /tmp/mini /tmp/repo /tmp/state && tar --exclude=./.carry/G3 -cf - . | tar -xf - -C /tmp/repo || exit 1
. .carry/S17/pre.sh
python3 benchmarks/bundle.py add .carry/G3/bundle-*-1of3 || exit 1
setsid nohup bash /tmp/repo/.carry/S17/$1 $2 $3 > /tmp/mini/lease.log 2>&1 < /dev/null &
sleep 15; cat /tmp/mini/lease.log; nproc; free -g | head -2
