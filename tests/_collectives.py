"""Which mesh axes a compiled program's collectives run over, read from its HLO text."""

import re

import numpy as np

_OP = re.compile(
    r"=\s*(?P<shape>\([^=]*?\)|\S+)\s+"
    r"(?P<op>all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute)(?:-start)?\("
    r"(?P<rest>.*)$"
)


def _iota(dims, perm, shape):
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if perm:
        ids = ids.transpose(perm)
    return ids.reshape(shape)


def _groups(rest):
    """The device groups of one collective (lists of device ids), or None when unreadable."""
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", rest)
    if m:
        return [list(map(int, g.split(","))) for g in re.findall(r"\{([\d,]+)", m[1] + "}")]
    m = re.search(r"replica_groups=\{(\{.*?\})\}", rest)
    if m:
        return [list(map(int, g.split(","))) for g in re.findall(r"\{([\d,]+)\}", m[1])]
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest)
    if m:
        shape = [int(d) for d in m[1].split(",")]
        dims = [int(d) for d in m[2].split(",")]
        perm = [int(d) for d in m[3].split(",")] if m[3] else None
        return _iota(dims, perm, shape).tolist()
    m = re.search(
        r"replica_groups=mesh\[(.*?)\], device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\) \{(.*?)\}",
        rest,
    )
    if m:
        axes = re.findall(r"'(\w+)'=(\d+)", m[1])
        sizes = [int(s) for _, s in axes]
        dims = [int(d) for d in m[2].split(",")]
        perm = [int(d) for d in m[3].split(",")] if m[3] else None
        ids = _iota(dims, perm, sizes)
        over = [i for i, (n, _) in enumerate(axes) if f"'{n}'" in m[4]]
        keep = [i for i in range(len(axes)) if i not in over]
        ids = ids.transpose(keep + over).reshape(-1, int(np.prod([sizes[i] for i in over])))
        return ids.tolist()
    return None


def collectives_over(hlo, mesh):
    """``[(op, [result dims...], spanned mesh axes)]`` for every collective in ``hlo``: the mesh
    axes along which the devices of one group differ."""
    coords = {int(d): c for c, d in np.ndenumerate(mesh.device_ids)}
    found = []
    for line in re.sub(r"/\*.*?\*/", "", hlo).splitlines():
        m = _OP.search(line)
        if not m or "-done" in line:
            continue
        arrays = [
            [int(d) for d in a.split(",") if d] for a in re.findall(r"\w+\[([\d,]*)\]", m["shape"])
        ]
        groups = _groups(m["rest"])
        spanned = set()
        if groups is None:
            spanned = {"?"}
        else:
            for g in groups:
                cs = [coords[d] for d in g]
                for i, name in enumerate(mesh.axis_names):
                    if len({c[i] for c in cs}) > 1:
                        spanned.add(name)
        found.append((m["op"], arrays, spanned))
    return found


def partitioned_hlo(lowered):
    """The HLO of ``lowered`` just after XLA's SPMD partitioner: its collectives in the element
    types the program asks for, before a backend's own passes (XLA:CPU widens float8 and bfloat16
    collectives to wider floats; a GPU does not)."""
    import glob
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        options = {"xla_dump_to": folder, "xla_dump_hlo_pass_re": "spmd-partitioning"}
        lowered.compile(compiler_options=options)
        [path] = [p for p in glob.glob(f"{folder}/*") if "after_spmd-partitioning" in p]
        with open(path) as f:
            return f.read()


def gathered(hlo):
    """``{(element type, element count)}`` of the all-gathers in ``hlo``."""
    found = set()
    for m in re.finditer(r"=\s*(\w+)\[([\d,]*)\][^=\n]*?\sall-gather(?:-start)?\(", hlo):
        found.add((m[1], int(np.prod([int(d) for d in m[2].split(",") if d]))))
    return found
