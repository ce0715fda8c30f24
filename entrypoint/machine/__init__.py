"""The machine a node runs on: the only room that looks at the hardware and the filesystem.

    hardware.py       GPUs, TPUs, CPUs, /dev/shm, network interfaces and addresses, free ports
    nvidia_driver.py  the host's NVIDIA driver against the image's CUDA (the check at start)
    accelerators.py   which accelerator the processes use (CPU, GPU, TPU), from the facts above
    writable_dirs.py  the folders the processes write to, checked or redirected (read-only runtimes)
"""
