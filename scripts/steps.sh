# shellcheck shell=bash
# Step timing for the check scripts; sourced by scripts/test.sh and tests/c/run.sh.
#
#   step NAME       ends the running step (printing its times) and starts NAME
#   steps_summary   ends the running step and prints one line per step and the total;
#                   the sourcing script calls it from its EXIT trap, so a failing run shows
#                   where its time went too
#
# Wall time is the elapsed time. CPU time is user + system time of every process the step ran
# (cargo, rustc, the linker, valgrind, Python), added over all cores: it is what the step costs,
# and it depends much less on what else the machine runs than the wall time does. The 1-minute
# load average is printed beside each step: a wall time far above CPU time / cores means the
# cores were busy with something else. Needs bash >= 5 for sub-second wall times (whole seconds
# otherwise) and Linux /proc for CPU times (printed as "?" without it).

STEPS_TAG="${STEPS_TAG:-==>}"
_steps_names=()
_steps_wall=()
_steps_cpu=()
_steps_current=""
_steps_hz="$(getconf CLK_TCK 2>/dev/null || echo 100)"

# Sets _steps_w (microseconds since the epoch) and _steps_c (CPU clock ticks of the finished
# children of this shell, -1 when unknown). No subshell: a forked shell has its own counters.
_steps_sample() {
    local t="${EPOCHREALTIME:-}" stat
    local -a f
    if [[ -n "$t" ]]; then
        _steps_w=$((10#${t/[.,]/}))
    else
        _steps_w=$((SECONDS * 1000000))
    fi
    _steps_c=-1
    if read -r stat 2>/dev/null </proc/$$/stat; then
        # Fields after "pid (comm) ": state ppid ... utime stime cutime cstime (proc(5)).
        read -r -a f <<<"${stat##*) }"
        _steps_c=$((f[13] + f[14]))
    fi
}

_steps_secs() { # $1 microseconds -> "12.3"
    printf '%d.%d' $(($1 / 1000000)) $((($1 % 1000000) / 100000))
}

_steps_cpu_secs() { # $1 clock ticks (or -1) -> "12.3"
    if (($1 < 0)); then
        printf '?'
    else
        printf '%d.%d' $(($1 / _steps_hz)) $((($1 % _steps_hz) * 10 / _steps_hz))
    fi
}

_steps_load() {
    local load _
    read -r load _ 2>/dev/null </proc/loadavg || load="?"
    printf '%s' "$load"
}

_steps_close() {
    [[ -n "$_steps_current" ]] || return 0
    _steps_sample
    local dw=$((_steps_w - _steps_t0)) dc=-1
    if ((_steps_c >= 0 && _steps_c0 >= 0)); then dc=$((_steps_c - _steps_c0)); fi
    _steps_names+=("$_steps_current")
    _steps_wall+=("$dw")
    _steps_cpu+=("$dc")
    printf '    (%s s wall, %s s CPU, load average %s: %s)\n' "$(_steps_secs "$dw")" \
        "$(_steps_cpu_secs "$dc")" "$(_steps_load)" "$_steps_current"
    _steps_current=""
}

step() {
    _steps_close
    _steps_current="$*"
    _steps_sample
    _steps_t0=$_steps_w
    _steps_c0=$_steps_c
    printf '\n%s %s\n' "$STEPS_TAG" "$*"
}

steps_summary() {
    _steps_close
    local i total_w=0 total_c=0
    printf '\n%s time per step (CPU: user + system over all cores; %s cores; load average %s)\n' \
        "$STEPS_TAG" "$(nproc 2>/dev/null || echo '?')" "$(_steps_load)"
    printf '  %8s %8s  %s\n' "wall s" "CPU s" "step"
    for i in "${!_steps_names[@]}"; do
        printf '  %8s %8s  %s\n' "$(_steps_secs "${_steps_wall[i]}")" \
            "$(_steps_cpu_secs "${_steps_cpu[i]}")" "${_steps_names[i]}"
        total_w=$((total_w + _steps_wall[i]))
        if ((total_c >= 0 && _steps_cpu[i] >= 0)); then
            total_c=$((total_c + _steps_cpu[i]))
        else
            total_c=-1
        fi
    done
    printf '  %8s %8s  %s\n' "$(_steps_secs "$total_w")" "$(_steps_cpu_secs "$total_c")" "total"
}
