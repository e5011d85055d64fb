"""CUDA-event timing shared by the PyTorch anchors in bench/gpu (imported from the script's own folder)."""
import torch


def event_times_ms(fn, reps):
    """fn run once to warm up, then reps times, each timed alone by CUDA events; the times in ms, sorted."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)


def median_ms(fn, reps=50):
    times = event_times_ms(fn, reps)
    return times[len(times) // 2]
