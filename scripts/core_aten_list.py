# Lists PyTorch's Core ATen operators (overloads tagged torch.Tag.core), one name.overload a line:
#   python3 scripts/core_aten_list.py > tests/ops/core_aten_ops.txt.new   (needs torch >= 2.1)
import torch
out = []
for name in dir(torch.ops.aten):
    try:
        packet = getattr(torch.ops.aten, name)
        overloads = packet.overloads()
    except Exception:
        continue
    for ov in overloads:
        op = getattr(packet, ov)
        if torch.Tag.core in op.tags:
            out.append(name if ov == "default" else f"{name}.{ov}")
print("# torch", torch.__version__)
print("\n".join(sorted(out)))
