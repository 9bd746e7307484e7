"""DeepSpeed's hostfile ("HOST slots=N" lines) and its --include/--exclude filters."""
import socket

from .common import die


def parse_hostfile(path):
    """Returns an ordered dict host -> number of slots."""
    hosts = {}
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        die(f"cannot read hostfile {path}: {e.strerror}")
    for lineno, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("slots="):
            die(f"{path}:{lineno}: expected 'HOST slots=N', got '{raw.strip()}'")
        try:
            slots = int(parts[1][len("slots="):])
        except ValueError:
            die(f"{path}:{lineno}: slots must be an integer, got '{parts[1]}'")
        if slots < 1:
            die(f"{path}:{lineno}: slots must be >= 1")
        if parts[0] in hosts:
            die(f"{path}:{lineno}: host '{parts[0]}' listed twice")
        hosts[parts[0]] = slots
    if not hosts:
        die(f"hostfile {path} lists no hosts")
    return hosts


def parse_filter(text, hosts, flag):
    """'h1@h2:0,2' -> {h1: None (all slots), h2: [0, 2]}."""
    result = {}
    for item in text.split("@"):
        item = item.strip()
        if not item:
            continue
        if ":" in item:
            host, slot_text = item.split(":", 1)
            try:
                slots = [int(s) for s in slot_text.split(",") if s.strip() != ""]
            except ValueError:
                die(f"{flag} '{text}': slots of '{host}' must be integers")
        else:
            host, slots = item, None
        if host not in hosts:
            die(f"{flag} '{text}': host '{host}' is not in the hostfile")
        for s in slots or []:
            if s < 0 or s >= hosts[host]:
                die(f"{flag} '{text}': host '{host}' has slots 0..{hosts[host] - 1}, not {s}")
        if host in result and result[host] is not None and slots is not None:
            result[host] = sorted(set(result[host]) | set(slots))
        else:
            result[host] = None if slots is None else sorted(set(slots))
    return result


def select_resources(hosts, include, exclude):
    """Returns an ordered dict host -> list of selected slot indices (hosts with none dropped)."""
    if include and exclude:
        die("--include and --exclude are mutually exclusive")
    selected = {h: list(range(n)) for h, n in hosts.items()}
    if include:
        inc = parse_filter(include, hosts, "--include")
        selected = {h: (list(range(hosts[h])) if inc[h] is None else inc[h]) for h in hosts if h in inc}
    elif exclude:
        exc = parse_filter(exclude, hosts, "--exclude")
        for h, slots in exc.items():
            if slots is None:
                selected.pop(h, None)
            else:
                selected[h] = [s for s in selected[h] if s not in slots]
        selected = {h: s for h, s in selected.items() if s}
    if not selected:
        die("no slots left after --include/--exclude")
    return selected


def world_from_resources(resources):
    """[(host, first_rank, slots)] in hostfile order."""
    world, rank = [], 0
    for host, slots in resources.items():
        world.append((host, rank, slots))
        rank += len(slots)
    return world, rank


def is_local_host(host):
    if host in ("localhost", "127.0.0.1", "::1"):
        return True
    try:
        return host in (socket.gethostname(), socket.getfqdn())
    except OSError:
        return False
