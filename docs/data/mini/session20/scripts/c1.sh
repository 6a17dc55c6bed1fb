# call 1: the tree to /tmp/repo, the wheels, the GGUF's first chunk of three, then the daemon; $1: the lease script,
# $2: the epoch second to pack by; later calls bring the other chunks (c1b.sh, c2.sh), then watch (watch.sh).
# A piece of the checkpoint's bundle (.carry/S20ck, lease 16) travels beside each chunk.
mkdir -p /tmp/mini /tmp/repo /tmp/state /tmp/out && tar --exclude=./.carry/G3 --exclude=./.carry/S20ck -cf - . | tar -xf - -C /tmp/repo || exit 1
. .carry/S20/pre.sh
python3 benchmarks/bundle.py add .carry/G3/bundle-*-1of3 || exit 1
[ -d .carry/S20ck ] && { python3 benchmarks/bundle.py add .carry/S20ck/bundle-* --store /tmp/ckstore || exit 1; }
setsid nohup bash /tmp/repo/.carry/S20/$1 $2 > /tmp/mini/lease.log 2>&1 < /dev/null &
sleep 15; cat /tmp/mini/lease.log; nproc; free -g | head -2
