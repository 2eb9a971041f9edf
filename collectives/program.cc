#include "collectives/program.h"

#include "collectives/ir/op_registry.h"

namespace shardsim {

const char* OpKindName(OpKind kind) { return Op(kind).name; }

std::optional<OpKind> ParseOpKind(const std::string& name) {
  const OpDef* def = FindOp(name);
  if (!def) return std::nullopt;
  return def->kind;
}

std::vector<std::string> OpKindNames() { return UserOpNames(); }

const char* ProgramModeName(ProgramMode mode) {
  switch (mode) {
    case ProgramMode::kManual:
      return "manual";
    case ProgramMode::kExplicit:
      return "explicit";
    case ProgramMode::kAuto:
      return "auto";
  }
  return "manual";
}

ProgramSpec WithoutOps(const ProgramSpec& program) {
  ProgramSpec shell;
  shell.mode = program.mode;
  shell.mesh_axes = program.mesh_axes;
  shell.mesh_devices = program.mesh_devices;
  shell.meshes = program.meshes;
  shell.arrays = program.arrays;
  shell.outputs = program.outputs;
  return shell;
}

int MeshIndex(const ProgramSpec& program, const std::string& name) {
  for (size_t i = 0; i < program.meshes.size(); ++i) {
    if (program.meshes[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

bool IsCollective(OpKind kind) {
  OpStream stream = Op(kind).stream;
  return stream == OpStream::kCollective || stream == OpStream::kComposite;
}

}  // namespace shardsim
