# Runs one program of a /run_code request inside its function call (POSIX sh).
# Arguments: compile timeout, run timeout, the tools the language needs, the compile command
# (empty: none), the run command. Each step leaves "<exit status> <start ns> <end ns>" in
# $S/<step>.rc; the compile step's output goes to $S/compile.out and .err, the run step's
# to the call's own stdout and stderr (and it alone reads the call's stdin).
S=/tmp/.warren-fusion
ct=$1 rt=$2 needs=$3 compile=$4 run=$5
cd /tmp/code || exit 90
for t in timeout $needs; do
    if ! command -v "$t" > /dev/null 2>&1; then
        printf '%s' "$t" > "$S/missing"
        exit 0
    fi
done
if [ -n "$compile" ]; then
    s=$(date +%s%N)
    timeout -s KILL "$ct" /bin/sh -c "$compile" < /dev/null > "$S/compile.out" 2> "$S/compile.err"
    rc=$?
    echo "$rc $s $(date +%s%N)" > "$S/compile.rc"
    [ "$rc" -eq 0 ] || exit 0
fi
s=$(date +%s%N)
timeout -s KILL "$rt" /bin/sh -c "$run"
rc=$?
echo "$rc $s $(date +%s%N)" > "$S/run.rc"
