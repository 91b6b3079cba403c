export { loadSecretKey } from "../../lib/files";
export { type VcsCredential, VcsTokenStore } from "./vcs-token";
