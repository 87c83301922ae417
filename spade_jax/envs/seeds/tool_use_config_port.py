"""Config port: explore a small file system to find the port a service really uses.

Skill: Multi-Step_Workflows
Tools: list_dir(path) and read_file(path); include lines override earlier settings.
ToolUseEnv is provided by the host.
"""
import json

SERVICES = ["mailer", "search", "billing", "gateway", "metrics", "scheduler"]


class ConfigPortEnv(ToolUseEnv):  # noqa: F821 - ToolUseEnv is injected by the host
    def reset(self, seed=None):
        rng = self.rng
        names = rng.sample(SERVICES, 4)
        self.service = names[0]
        files = {}
        self.chain = []
        for i, svc in enumerate(names):
            main = f"/etc/{svc}/main.conf"
            port = rng.randint(1025, 9999)
            text = f"name = {svc}\nport = {port}\nworkers = {rng.randint(1, 8)}\n"
            if i == 0 or rng.random() < 0.5:
                extra = f"/etc/{svc}/conf.d/{rng.choice(['local', 'prod', 'site'])}.conf"
                text += f"include = {extra}\n"
                files[extra] = f"# overrides\nport = {rng.randint(1025, 9999)}\n"
                if i == 0:
                    self.chain = [main, extra]
                    self._expected_answer = int(files[extra].split("= ")[-1])
            files[main] = text
            files[f"/etc/{svc}/README"] = f"Settings for {svc}. Later files override earlier ones."
        self._state = {"files": files}
        self._tools = {
            "list_dir": {"description": "List the entries directly inside a directory.",
                         "parameters": {"type": "object", "properties": {
                             "path": {"type": "string"}}, "required": ["path"]}},
            "read_file": {"description": "Return the text of a file.",
                          "parameters": {"type": "object", "properties": {
                              "path": {"type": "string"}}, "required": ["path"]}},
        }
        task = (f"Which TCP port does the '{self.service}' service actually listen on? Its "
                "configuration lives somewhere under /etc. A line 'include = PATH' loads another "
                "file whose settings override the ones before it. Answer with the port number.")
        return self.task_observation(task), {}

    def tool_list_dir(self, path):
        p = "/" + str(path).strip().strip("/")
        prefix = "/" if p == "/" else p + "/"
        entries = sorted({f[len(prefix):].split("/")[0] + ("/" if "/" in f[len(prefix):] else "")
                          for f in self._state["files"] if f.startswith(prefix)})
        return ", ".join(entries) if entries else f"No such directory: {p}"

    def tool_read_file(self, path):
        p = "/" + str(path).strip().strip("/")
        if p not in self._state["files"]:
            return f"No such file: {p}"
        return self._state["files"][p]

    def solution(self):
        calls = [("list_dir", "/etc"), ("list_dir", f"/etc/{self.service}")]
        calls += [("read_file", f) for f in self.chain]
        out = "".join("<tool_call>" + json.dumps({"name": n, "arguments": {"path": p}})
                      + "</tool_call>" for n, p in calls)
        return out + f"<answer>{self._expected_answer}</answer>"

    def hint(self):
        return ("Open the service's main configuration file and follow its include line; the "
                "port in the included file is the one that counts, not the first port you see.")
