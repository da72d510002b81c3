"""Count import cycles in cdc_outbox, counting imports inside functions too (grimp's graph).

Usage: .venv/bin/python scripts/import_cycles.py [-v]
Prints the number of module-level cycles (strongly connected groups of modules) and of cycles
between top-level units (sub-packages and top-level modules of cdc_outbox), each group listed.
Exits 1 if there is any cycle (run by ``make lint``, next to the lint-imports layer contracts).
"""

from __future__ import annotations

import sys
from collections import defaultdict

import grimp


def _sccs(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<package __init__>"


def main() -> int:
    graph = grimp.build_graph("cdc_outbox", include_external_packages=False)
    modules = set(graph.modules)
    mod_edges: dict[str, set[str]] = defaultdict(set)
    unit_edges: dict[str, set[str]] = defaultdict(set)
    for importer in modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            # A package importing its own sub-module (an __init__ re-export) is not a cycle of
            # design; grimp counts it, so it is counted here too, like any other edge.
            mod_edges[importer].add(imported)
            a, b = _unit(importer), _unit(imported)
            if a != b and "<" not in a + b:
                unit_edges[a].add(b)
    module_cycles = _sccs(modules, mod_edges)
    units = {_unit(m) for m in modules if "<" not in _unit(m)}
    unit_cycles = _sccs(units, unit_edges)
    print(f"module-level cycles (strongly connected groups): {len(module_cycles)}")
    for group in module_cycles:
        print("  " + " <-> ".join(group))
    print(f"top-level unit cycles (strongly connected groups): {len(unit_cycles)}")
    for group in unit_cycles:
        print(f"  {len(group)} units: " + ", ".join(group))
    if "-v" in sys.argv:
        for group in unit_cycles:
            members = set(group)
            for a in sorted(members):
                for b in sorted(unit_edges[a] & members):
                    print(f"    {a} -> {b}")
    return 1 if module_cycles or unit_cycles else 0


if __name__ == "__main__":
    sys.exit(main())
