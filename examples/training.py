"""A small training script: forward + backward + SGD step, with one graph break in the forward."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--mode", default=None)
args = parser.parse_args()

torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, 2 * width)
        self.fc2 = torch.nn.Linear(2 * width, width)

    def forward(self, x):  # x: [batch, width]
        h = torch.relu(self.fc1(x)) * torch.sigmoid(x.sum(-1, keepdim=True))
        torch._dynamo.graph_break()  # two graphs: before and after the break, each with fw and bw
        return torch.tanh(self.fc2(h)) + x


model = Net().to(args.device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = torch.compile(model, mode=args.mode)
x = torch.randn(args.batch, 64, device=args.device)
target = torch.randn(args.batch, 64, device=args.device)
for _ in range(args.steps):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(step(x), target)
    loss.backward()
    opt.step()
print(f"training: loss {float(loss):.5f}")
