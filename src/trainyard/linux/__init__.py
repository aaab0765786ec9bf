"""Linux helpers shared by the backends and the task runner (bottom layer).

Modules:
    libc        the C library, loaded once (``ctypes``)
    proctree    process trees: children, kill a tree, process identity
    safefs      files opened following no symlink; overlays, private mounts
    nsgate      a user namespace gate (``user.max_user_namespaces`` = 0 inside)
    userns      user namespaces: maps, fresh folders, handing folders to a task
    thread_ids  one thread's uid/gid switched with the raw system calls

They import nothing above the bottom layer (``docs/architecture.md``).
"""
