"""What the kernel maps a process's memory with: its huge page entries, from /proc/PID/smaps."""

SMAPS_PMD = ("ShmemPmdMapped:", "FilePmdMapped:")


def pmd_mapped_kib(addr: int, pid: str = "self") -> int:
    """kB of the mapping starting at `addr` that this process maps with 2 MiB entries."""
    inside = False
    total = 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == addr
            elif inside and head in SMAPS_PMD:
                total += int(line.split()[1])
    return total
