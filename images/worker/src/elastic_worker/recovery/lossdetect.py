"""Silent-loss detection: the members of the running round keep short-lived keys in
etcd; when one lapses, the node-loss policy (policy.py) hears of it.

A node that vanishes without resetting its sockets (link cut, frozen VM, kernel panic)
leaves the others blocked inside a collective until the script's process-group timeout
(30 min with gloo's default). torchrun cannot see it: its workers are alive, only
blocked. So, beside torchrun (docs/contracts.md, "Round liveness"):

- A round is what the workers of one attempt share: TORCHELASTIC_RUN_ID and
  MASTER_ADDR:MASTER_PORT (torch's documented worker environment; the round's rank 0
  agent picks a free port for every round), read from the environment of the program
  the attempt shim started (its attempt line gives the PID).
- While this pod's attempt runs, <prefix>/rounds/<round>/<pod> holds `alive` with a TTL,
  refreshed well within it (timings.py, ROUND_KEY_*). When the attempt ends or the worker
  stops, it is rewritten `left` (a clean leave: nobody reacts) and expires later. The
  round's `.round` marker (written once, without a TTL) tells a lapse from etcd losing its
  data (a new etcd pod: every key gone at once; nobody is stopped, the keys come back).
- The round's members are read every ROUND_POLL. A member seen `alive` whose key is gone
  has lapsed (its pod stopped refreshing: cut off, frozen, killed): `peers_lapsed`. This
  pod's own key found lapsed at a refresh, the marker unchanged, means the others went on
  without it: `own_key_lapsed`; no refresh landed for the TTL by the local clock (a
  process that was frozen notices the moment it runs again): `own_key_stale`. The members
  seen alive at each read: `peers_alive`.

What is done about each is the policy's. The one action that lives here, because it needs
what the detector knows of the attempt, is `stop_attempt`: SIGKILL of the attempt's
program (torchrun sees a failed worker, stops the others and re-forms), or for a script
that keeps snapshots (it said `restored=` in the progress file: observe/snapshots.py)
SIGTERM, so that it saves its last step from a thread, then SIGKILL once it said `saved=`
or after `stop_grace` (what torchrun gives a worker after SIGTERM).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from elastic_worker import timings
from elastic_worker.attempt_line import Tail, parse_attempt, process_alive
from elastic_worker.keystore import interface as kvstore
from elastic_worker.launch import argv
from elastic_worker.observe import snapshots
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)

ALIVE, LEFT = "alive", "left"
#: Who may stop an attempt, and the chart value that turns it off.
_SWITCHES = {
    "silent loss": "rendezvous.lossDetection.enabled",
    "hang": "hangDetection.enabled",
}
MARKER = ".round"  # not a pod name (those are DNS labels): the round's marker key


@dataclass(frozen=True)
class RoundAttempt:
    """This pod's current attempt: its round and the program torchrun started."""

    round: str
    pid: int


def round_of(run_id: str, pid: int) -> str | None:
    """`<run_id>@<MASTER_ADDR>:<MASTER_PORT>` from the program's environment; None when
    it has ended or the variables are missing (torch sets both for every worker)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    addr, port = env.get(b"MASTER_ADDR"), env.get(b"MASTER_PORT")
    if not addr or not port:
        return None
    name = f"{run_id}@{addr.decode(errors='replace')}:{port.decode(errors='replace')}"
    return name.replace("/", "_")


class Listener(Protocol):
    """What the detector tells: the node-loss policy (policy.NodeLoss)."""

    def held(self) -> bool:
        """This pod must act on nobody now (it may be the one cut off)."""
        ...

    def own_key_stale(self, why: str) -> bool:
        """No refresh of this pod's key landed for its TTL; False: refresh nothing now."""
        ...

    def own_key_lapsed(self, attempt: RoundAttempt, why: str) -> None: ...

    def peers_lapsed(self, attempt: RoundAttempt, lapsed: list[str], survivors: set[str]) -> None:
        """`lapsed` stopped renewing their keys in this pod's round; `survivors` did not."""
        ...

    def peers_alive(self, names: set[str]) -> None:
        """The members seen alive in this pod's round, at each read."""
        ...


class LossDetector:
    """Keeps this pod's key for its current round and watches the round's other members,
    telling `listener` what it sees. `attempt_log` is the file the attempt shim appends to
    (ELASTIC_ATTEMPT_LOG)."""

    def __init__(
        self,
        client: kvstore.KeyStore,
        config: Config,
        attempt_log: Path,
        *,
        ttl: int = timings.ROUND_KEY_TTL,
        refresh: float = timings.ROUND_KEY_REFRESH,
        poll: float = timings.ROUND_POLL,
        listener: Listener,
        saves: snapshots.Saves | None = None,
        stop_grace: float = 30.0,
    ) -> None:
        self.saves = saves
        self.stop_grace = stop_grace
        # One client per thread, with a short timeout: a refresh never waits on a read.
        self._writer = client.with_timeout(timings.ROUND_REQUEST_TIMEOUT)
        self._reader = client.with_timeout(timings.ROUND_REQUEST_TIMEOUT)
        self.config = config
        self.dir = f"{config.key_prefix}/rounds"
        self.ttl, self.refresh, self.poll = ttl, refresh, poll
        self._log = Tail(attempt_log)
        self._lock = threading.Lock()
        self._attempt: RoundAttempt | None = None
        self._written: str | None = None  # the round whose key this pod last wrote alive
        self._last_round: str | None = None  # the round this pod was last a member of
        self._marker: str | None = None  # that round's marker (_read_marker)
        self._watched: str | None = None  # the round `_seen` belongs to
        self._seen: set[str] = set()  # members seen alive in that round
        self.listener = listener
        #: Replaced by a newer incarnation: this pod's key is not rewritten at stop.
        self.replaced: Callable[[], bool] = lambda: False
        self._last_ok: float | None = None  # monotonic: this pod's last refresh that landed
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def key(self, round_: str, pod: str | None = None) -> str:
        return f"{self.dir}/{round_}/{pod or self.config.pod_name}"

    def start(self) -> None:
        for name, target in (("liveness-refresh", self._refresh), ("liveness-watch", self._watch)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop both threads and leave the current round cleanly."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=timings.ROUND_REQUEST_TIMEOUT * 2)
        if not self.replaced():
            self._leave()

    def _refresh(self) -> None:
        while not self._stop.wait(self.refresh):
            self.refresh_once()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.watch_once()
            except Exception as exc:  # noqa: BLE001 - detection must never end the worker
                logger.debug("round liveness: %s", exc)

    def current(self) -> RoundAttempt | None:
        """Read new attempt lines; the attempt whose program still runs, if any."""
        with self._lock:
            for line in self._log.lines():
                parsed = parse_attempt(line)
                if parsed is None:
                    continue
                round_ = round_of(parsed.run_id, parsed.pid)
                if round_ is not None:
                    self._attempt = RoundAttempt(round_, parsed.pid)
            if self._attempt is not None and not process_alive(self._attempt.pid):
                self._attempt = None
            return self._attempt

    def stale(self) -> float | None:
        """Seconds since this pod's key last landed, when that is longer than its TTL (the
        others have gone on without it); None otherwise. The local clock only."""
        if self._written is None or self._last_ok is None:
            return None
        age = time.monotonic() - self._last_ok
        return age if age > self.ttl else None

    def refresh_once(self) -> None:
        """Write or refresh this pod's key of the current round; leave a finished one."""
        age = self.stale()
        if age is not None:
            why = (
                f"this pod's key {self.key(self._written or '')} has not been refreshed for "
                f"{age:.0f} s (its TTL is {self.ttl} s: cut off or frozen)"
            )
            if not self.listener.own_key_stale(why):
                return
            self._last_ok = time.monotonic()
        attempt = self.current()
        if self._written is not None and (attempt is None or attempt.round != self._written):
            self._leave()
        if attempt is None:
            return
        first = self._written != attempt.round
        try:
            # After the first write, prevExist: a key that lapsed is not silently rewritten.
            self._writer.set(
                self.key(attempt.round), ALIVE, ttl=self.ttl, prev_exist=None if first else True
            )
            if first:
                self._marker = self._read_marker(attempt.round)
            self._written = self._last_round = attempt.round
            self._last_ok = time.monotonic()
        except kvstore.KeyNotFound:
            self._lapsed(attempt)
        except kvstore.EtcdError as exc:
            logger.debug("could not refresh %s: %s", self.key(attempt.round), exc)

    def _read_marker(self, round_: str) -> str | None:
        """The round's marker (written once, by its first member, without a TTL): the
        same value later means the same etcd data."""
        key = f"{self.dir}/{round_}/{MARKER}"
        try:
            self._writer.set(key, f"{self.config.pod_name} {time.time():.6f}", prev_exist=False)
        except kvstore.NodeExists:
            pass
        except kvstore.EtcdError:
            return None
        try:
            return self._writer.get_value(key)
        except kvstore.EtcdError:
            return None

    def _lapsed(self, attempt: RoundAttempt) -> None:
        """This pod's key is gone. With the round's marker as it was, it lapsed: the
        others went on without this pod. With the marker gone or another one, etcd lost
        its data (a new etcd pod): the key is written again."""
        try:
            marker = self._writer.get_value(f"{self.dir}/{attempt.round}/{MARKER}")
        except kvstore.EtcdError as exc:
            logger.debug("could not read the marker of round %s: %s", attempt.round, exc)
            return  # the next refresh asks again
        self._written = None
        if self._marker is not None and marker != self._marker:
            logger.info("round %s is gone from etcd (a new etcd?): joining it again", attempt.round)
            return
        self.listener.own_key_lapsed(
            attempt,
            f"this pod's key {self.key(attempt.round)} lapsed (cut off from etcd for more "
            f"than {self.ttl} s): the others have gone on without it",
        )

    def watch_once(self) -> None:
        """One read of the current round's members: the lapsed ones told."""
        if self.listener.held():
            return  # this pod may be the one cut off: it judges nobody
        attempt = self.current()
        if attempt is None or attempt.round != self._watched:
            self._watched = attempt.round if attempt is not None else None
            self._seen = set()
        if attempt is None:
            return
        try:
            nodes = self._reader.list_dir(f"{self.dir}/{attempt.round}")
        except kvstore.EtcdError as exc:
            logger.debug("could not read the members of round %s: %s", attempt.round, exc)
            return
        names = {n.key.rsplit("/", 1)[-1]: n.value for n in nodes}
        alive = {name for name, value in names.items() if value == ALIVE and name != MARKER}
        left = {name for name, value in names.items() if value == LEFT and name != MARKER}
        self.listener.peers_alive(alive)
        if self.config.pod_name not in alive:
            # This pod's own key is not there (not written yet, lapsed, or etcd lost its
            # data): nothing here says that another member is the one cut off.
            self._seen = set()
            return
        lapsed = sorted(self._seen - alive - left - {self.config.pod_name})
        self._seen = (self._seen | alive) - left - set(lapsed)
        if lapsed:
            self.listener.peers_lapsed(attempt, lapsed, alive - set(lapsed))

    def unfinished(self) -> list[str] | None:
        """The other members of this pod's last round whose attempt still runs (their key
        says alive), by pod name; None when etcd cannot say. What a node that has
        finished waits for in torch's exit barrier (launch/supervisor.py, ExitBarrier)."""
        round_ = self._last_round
        if round_ is None:
            return None
        try:
            nodes = self._reader.list_dir(f"{self.dir}/{round_}")
        except kvstore.EtcdError:
            return None
        names = {n.key.rsplit("/", 1)[-1]: n.value for n in nodes}
        mine = {MARKER, self.config.pod_name}
        return sorted(name for name, value in names.items() if value == ALIVE and name not in mine)

    def stop_attempt(self, attempt: RoundAttempt, why: str, *, cause: str = "silent loss") -> None:
        """Stop `attempt`'s program so that torchrun re-forms now (see the module's doc);
        `cause` names what asked it (and the chart value that turns it off) in the log."""
        switch = _SWITCHES.get(cause, "")
        logger.warning(
            "%s: %s: stopping this pod's training process (pid %d) so that torchrun re-forms now%s",
            cause,
            why,
            attempt.pid,
            f" (chart: {switch}=false turns this off)" if switch else "",
        )
        saves = self.saves
        if saves is None or not saves.keeps:
            with contextlib.suppress(ProcessLookupError):  # it ended by itself meanwhile
                os.kill(attempt.pid, signal.SIGKILL)
            return
        before = saves.saved
        with contextlib.suppress(ProcessLookupError):
            os.kill(attempt.pid, signal.SIGTERM)
        threading.Thread(
            target=self._kill_once_saved, args=(attempt.pid, saves, before), daemon=True
        ).start()

    def _kill_once_saved(self, pid: int, saves: snapshots.Saves, before: int) -> None:
        """SIGKILL `pid` once its save is reported (its main thread may stay blocked in the
        dead collective), or `stop_grace` s after the SIGTERM; nothing if it ended."""
        deadline = time.monotonic() + self.stop_grace
        while process_alive(pid) and time.monotonic() < deadline:
            if saves.wait_saved(before, timeout=0.1):
                break
        if not process_alive(pid):
            return
        said = saves.saved > before
        logger.info(
            "the stopped training process (pid %d) %s: SIGKILL",
            pid,
            "saved its state" if said else f"did not save within {self.stop_grace:g} s",
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def _leave(self) -> None:
        written, self._written = self._written, None
        if written is None:
            return
        try:
            self._writer.set(self.key(written), LEFT, ttl=timings.ROUND_LEFT_TTL, prev_exist=True)
        except kvstore.EtcdError as exc:  # lapsed already, or etcd away: it expires
            logger.debug("could not leave round %s: %s", written, exc)


def stop_grace(config: Config, env: dict[str, str]) -> float:
    """What torchrun run with `env` gives a worker after SIGTERM (the user may have set it)."""
    return float(
        env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", argv.shutdown_timeout(config.grace_period))
    )
