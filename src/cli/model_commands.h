// The model commands of the local CLI: what one does with a trained model.
//   forge export    a checkpoint as safetensors (--format forge) or a Hugging Face Llama
//                   directory (--format hf)
//   forge import    a Hugging Face Llama directory as a Forge checkpoint
//   forge generate  text from a checkpoint or HF directory (KV-cache decoding, sampling)
//   forge eval      loss / perplexity / bits per byte on a dataset, multiple-choice tasks
#pragma once

namespace forge {

// argv[1] is the command; each returns the process exit code.
int RunExportCommand(int argc, char** argv);
int RunImportCommand(int argc, char** argv);
int RunGenerateCommand(int argc, char** argv);
int RunEvalCommand(int argc, char** argv);

}  // namespace forge
