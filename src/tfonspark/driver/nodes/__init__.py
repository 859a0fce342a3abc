"""The control plane and the nodes' life: roles, the rendezvous server, launches, the gang, restarts, reports, stop files."""
